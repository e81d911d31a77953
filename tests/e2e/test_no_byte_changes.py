"""No byte changes: the bundled samples' outputs, file by file, as they were before the one-core
rewrite (issue 12). The hashes were recorded from the earlier code; any change to a shard, a manifest,
the checksums or the stats shows here.
"""

from __future__ import annotations

import hashlib
import json

from conftest import REPO, SAMPLE_PARQUET, tree_hashes

from pipelines import cli
from shards.card import CARD_NAME
from shards.provenance import STATS_JSON_NAME

RUNNER = ["--runner=FnApiRunner"]

SAMPLE_HASHES = {
    # Issue 14: the record lists the tree's description (dataset_stats.json, README.md) as derived;
    # issue 26: and the reader index, processed_spec.idx (added below; no other file changed);
    # issue 35: the index gained its trailer (the manifest's sha256, its own): only its hash changed.
    ".pretokenize-tree.json": "c18cca6acfad81edb1db9263711d89ce0cdd80dc277b3e3b418c0ad5afb3977a",
    "processed_spec.idx": "290f91e48ca4418888bc9c4a986316d493cc745cb3f55f3c0170cef762413fe5",
    "1024/p00_00000.npy": "ff8846534814550d69338c89caccab60cf771c081e5d0bc130a4a52994fee365",
    "1024/p01_00000.npy": "9e7a5e598219871da7466554894c72cf33810ab52b1fc5e6fa5bc791b4c320e9",
    "1024/p03_00000.npy": "d42efda35652d36ffa7e7755cee19107b3c5dc5819f5b4fca8f6d622cfe99870",
    "1024/p04_00000.npy": "422186ae7d4b27ba80bec764dd72af59c203425e5f417f40876d563893fca97b",
    "1024/p05_00000.npy": "23b174b0ca725968da303231e6f414b7efd12bbf960f6bc733a0997eca9622c2",
    "1024/p06_00000.npy": "ac46cc989c9991ef1e00c4758e0fdf26983750dfa8d34c15307daa063087a28f",
    "1024/p07_00000.npy": "7d048bbbd6869a3fef5ab95babd4e634ebc278c603df9bbd03ea794a69678792",
    "1024/p08_00000.npy": "c56ddf4975249100b412727a8d1628cb4b2c6c0e045262619582121df17853db",
    "1024/p10_00000.npy": "6c924b083b677f0e7981b5150eebce04cc82628b43475fa71ad431e7339562a2",
    "1024/p11_00000.npy": "1dab1e1c2b5480d0ac900c3e67006d02ed783d763f62814984987e07ad1bc13c",
    "1024/p12_00000.npy": "4c61f1886b81b44c0daa68285058dd816973360075d80414189c080d6302d957",
    "1024/p13_00000.npy": "ba1506a0620795ba80227d6b9be50847d1c278ed447fc0eeb115b52e87eb5c58",
    "1024/p14_00000.npy": "ab696c5cd297f4b3b8b0c65e61b0af992bc7d44020168f0032018e69037863e3",
    "1024/p15_00000.npy": "afb03f07a0754086f09bba00206728c83242a191d19807fc4557b7e1229c182f",
    "1024/p16_00000.npy": "18bb055633c43a0f1f1736645bc50f9a7672697dfad4a13904226d5509a5196d",
    "1024/p18_00000.npy": "4fa80fa7fc56d2dc5c7ea5fe0fe55e611d02c0b0f436f141e76779112e8d2779",
    "1024/p19_00000.npy": "33b70090f6539790f4bec4d5de7560efdcf0ee29e1276254fc601342dca39ed6",
    "1024/p20_00000.npy": "af8f9c29af8cd8efb6c95b587a01872cea32a458fe628b2e401b39c69e4d262d",
    "1024/p21_00000.npy": "1e16aeea0cc7d6f00fdc37c05614254f6bf57ca5548c638436576030134498ec",
    "1024/p22_00000.npy": "e591aea831c621c07ffdf36a2c426d50fe66f334d8cf0aebedc3e438a8ad272f",
    "1024/p23_00000.npy": "413b45f362f19961ded400e1be8bf5f519cfbd6557d1b39a92c59137483147a5",
    "1024/p24_00000.npy": "04bc23fd8d3da274a1844429ae4e881a32cc9b78d79bf5889ae72d70bfc97f24",
    "1024/p25_00000.npy": "debe233bc61d0c4fb556005959f6d4fae9fc9b18b56ebded53df23ff29c3bec6",
    "1024/p26_00000.npy": "b396297e6b1d1dea560522dd66fa68156bc26b3a091b82c1a6697969ff4a6cef",
    "1024/p27_00000.npy": "d86be694b04f1346ae442dbb03ee59345479bc19da5204476bf7901f669fb256",
    "1024/p28_00000.npy": "764e683fee12a1465b7ef5af6b2e0b60248bc0b43c5c4d5538474d7c02bd9ec6",
    "1024/p29_00000.npy": "837f3f7bf1996bf3ae2cd4a9b4ed5ffe0c0237077b2c1983bd99746e00a03b5e",
    "1024/p31_00000.npy": "8a45cb072dcf5c4795f1d946f678ce244604f5661bb9c66a15dc81ef40d9c78a",
    "16384/p01_00000.npy": "2cc7bba4b75174c5a0ac96edf919d129d22c4a6e3a35d405e204d6a52e50048e",
    "16384/p02_00000.npy": "9cc949f8c19468071f3891924c7abf6e9c18ae8802ea06c62c7f3f5ae58c6e9b",
    "16384/p07_00000.npy": "313969723b14af8925690a944cff8ba15635013ad41794463e9dadc62b5e5054",
    "16384/p08_00000.npy": "51581de66fbf6c21015c409a050847d6513b4697876d20887b32f3947023a500",
    "16384/p09_00000.npy": "72a890587767f0a3493d24076f4a5ef6ae800bafb064e15de0f92ac213bfd463",
    "16384/p10_00000.npy": "0e9deab05cbb775ea0a67cc742fe83a860cdb6f6887829ee32a276cb84f452d3",
    "16384/p11_00000.npy": "13c3bb7edde74dd22b3b8ff766599ab3c851729d5b97f1277f596c0169202a3d",
    "16384/p15_00000.npy": "c4599ae58778a9ef6412698a2f38e428cf80c8f592e624d701d51e1adbb5b864",
    "16384/p29_00000.npy": "99119ed124e0323fd2305720d7e606d1e7078f327231e5adf4d72ba24d0cde97",
    "2048/p00_00000.npy": "3d1d48f8b6ea0e6e3126a5cdccef8da4ab1b23232fbe1768c23567513d6e3158",
    "2048/p01_00000.npy": "c6e24ccfd3e5e89ab5b1ac89b30568991730e7b0dd8799c52bf52ca8eaa333e1",
    "2048/p02_00000.npy": "2bb6d94891653b3afd665781e28a919397e02c2df0844727f6b53b3ab256e542",
    "2048/p03_00000.npy": "e6d1be6aec6671ba603982d7f1ca3e7fee9d52b19fe6bf4ffff927dcd686f8bc",
    "2048/p04_00000.npy": "b105d9ec617b49421deb30b3cc2fcdfcfa0f975ad0ebc690ae671532e1a10b24",
    "2048/p05_00000.npy": "79214d191c080fbd2675697cc5f2e0067e9a5593de1b7e9f3cf3a71bf995d4de",
    "2048/p07_00000.npy": "ee63d211b71e925aa79e0e756ca62e84b0d252c9768f76545e9d685c3fe8d0a5",
    "2048/p09_00000.npy": "3f5caace1a69ecb2fe782d879bc1ef6dbb2a84519ac48fd0e988e54d17952278",
    "2048/p10_00000.npy": "b21b61e571ab676fd64714aedfcecaf55a3394e8b4804329fe25b3f4a48be108",
    "2048/p11_00000.npy": "f4e6ca248d7b61d9ec017e163bc5c83de2f6a406389b4be833ae6b9632dad959",
    "2048/p12_00000.npy": "ebe83fcda9b3ed79bcd1f85e1cd572493d6c1d596ba787a7948c05684c026d9d",
    "2048/p14_00000.npy": "88415e80defe77cf2ba122ab5c100b9e865019c6b2186011ac5014098d36404a",
    "2048/p15_00000.npy": "5fdfa9a361b3a0a3e479b7e59fafb266279e72e3914cf6f878d9bca2005369fc",
    "2048/p18_00000.npy": "79c199d321dd808e92a5e4768b44e3371e465515eff28a2399b68184e7015a58",
    "2048/p22_00000.npy": "88b352d98dc0e196d184537866fde8bc942c972214e7034918869bf07a7236e5",
    "2048/p23_00000.npy": "ae468f18a6161d018bed42604a3ef506208ae5f61fcc992991118bde0e2bd7f0",
    "2048/p24_00000.npy": "7748fed84feced0493bde22af03ddbd674b5b6c19aa13ebc8f0309cd46c83cf5",
    "2048/p30_00000.npy": "cbc2be978a66c24edaebd33a5004b6da465db4cbfb85b3f8df45be9fff78f59e",
    "2048/p31_00000.npy": "69cb1f6c1f4295b70f6fac958a483f587841be94b615ea6f58e9d9973b56b283",
    "32768/p19_00000.npy": "f667eedd8aab9efa2dbfadadb0cc731520b11df3ed9b9e6a2e4a53514cb61d6a",
    "4096/p01_00000.npy": "870021ee49c8371a5ff6929e033cef7aa9fecaf5a164c7938b010552923c4788",
    "4096/p04_00000.npy": "44e6a9ed29e6809e415cca961a4cdd60559c2a6e109d95af45d547cc08b31f6c",
    "4096/p07_00000.npy": "e9e629efd52ee24dd260f09613210ad0df6882c0f6a7f4f5161acfb572e88184",
    "4096/p10_00000.npy": "79f4bd1eeaaca404fa6653938fb208d7af0c6958369221e753b0d0ea03edbe61",
    "4096/p11_00000.npy": "a44d725df6989e74804b5c8e0a34d2d0f0b17bbe38c956195fcd16008fd23ba5",
    "4096/p12_00000.npy": "f3c9f1b96620fd6c8eb5e7a6cbd306c01acc976cdc1f20f0fe0382a6fb5cde74",
    "4096/p13_00000.npy": "28e2bf66141ea383092f61ab66ab809d3772808da8c099525a24d7d9fd87de53",
    "4096/p16_00000.npy": "665f998fd12ff353aa72c1a2e8ca98f73260900564fb899b3438166d467574eb",
    "4096/p19_00000.npy": "92e2ad868b6571e428c1da8d5b462eda0a20ce85a6ab8057feedaedfc2ccbd66",
    "4096/p21_00000.npy": "2c7cb621fc4db9faa67efc6ece54b2b5da52434ac36542bba03df5ce3bad7bde",
    "4096/p22_00000.npy": "7f724b38187c2cdd5dcc916bbf1e00fa9ae1beb575217f05f96e2e6c922cd92a",
    "4096/p24_00000.npy": "67f48e63bf25de2802e1e77918b2a81ff0c1242a0a9cbe9e664b1b8d398ad967",
    "4096/p25_00000.npy": "9797d7cdf9feef4bb0857ccd393db296550dcbc157ca02cc041a6d9abedc025a",
    "4096/p27_00000.npy": "631d314bb6e3e8d23cc11887da588024b97afa4f4e76ac34e90c587f097b12cf",
    "8192/p00_00000.npy": "492b9f71814ae4349d77676898575669fc9bab2795dac6c0d0da167520a53699",
    "8192/p04_00000.npy": "766ecbc3b99669c69271b191bbe276b43387006e4419e24a9c52b0cd799fe3b2",
    "8192/p10_00000.npy": "8b54e8df37c523d36577a51d4b8602426f330a78418baebbc79d4a9621954a63",
    "8192/p11_00000.npy": "acef49a5bb608317734f02770666099d02e5f94df2cb867c73b7770de689491a",
    "8192/p12_00000.npy": "72cff48d6556b404b95c3f3a8f169858abcd243b891c85105656785800119eb4",
    "8192/p16_00000.npy": "5495b024bea8f5a6cc1a2731f4fc5f314f43a9c37ffbd3a9a61c7fed05916bea",
    "8192/p17_00000.npy": "47f8c19e56883388ea04a8798340e25d874bbe0d319406b4b38ba0e3a88f3999",
    "8192/p18_00000.npy": "f66ccdc9b3648303537d854f510ac783caaef9fdd191ebe2324a32b0198d88a6",
    "8192/p20_00000.npy": "5ff269110bb4eeceb503f9c70f3ba6cb858bbafc85889f4a41a0dad743b47705",
    "8192/p24_00000.npy": "38e9a2ba416daff8a80013503a0517bb22886b5c402029250d4bc5018196bcb7",
    "8192/p29_00000.npy": "9465509713353ccbb1fca26f7b713c54aecb8f6b7ba23cdd4ecd4b8914efcfba",
    "8192/p31_00000.npy": "b550de19cbf75234fcaac09b0b6bb663d2309999bcc8de5a6814c725c6dae21c",
    "beyond/p07_00000.npy": "aacd95e3c07eeea22c89299c263ba99a9cc3fdef4dae151770c7d299d72ab94c",
    "checksums.sha256": "787cb8b052443414518991efba9f8f84344bfc377b14abdc0df75977ef6b3fe7",
    # Issue 13: the stats name the backend that encoded ("tokenizer_backend: quicktok 0.4.0"); every
    # other hash here was left as it was, which is what proves quicktok's ids equal tiktoken's.
    "dataset_stats.txt": "365b3739993cbed15f4777eac602d940f3dbc965f1d9c6993a2a8def1dad838f",
    "processed_spec.txt": "4a95a3d9e57c812adbc3be2a464b202a672ecf7c908a93e13d34b03efe2b36a2",
}

SCAFFOLD_HASHES = {
    # Issue 14: as above, the record lists dataset_stats.json and README.md.
    ".pretokenize-tree.json": "0d8abc25ac235429abd30ab6b641cc64d5f22230a2efe0c3fd843ac1fdc104c3",
    "checksums.sha256": "ea57f11cc41ce66621860cc2d243a08d4720ef6bb7b6ac835267d2db6dd62714",
    "dataset_stats.txt": "9817c150bdb97aa6248a4721596d495ab8a387efcd31d023b0dbd4ccf2096507",
    "train/shard_000.bin": "702a51459eae26c722112372bcb8ec873aee41aa61ed148de05f772cfd609e5d",
    "train/shard_001.bin": "a8027fa18a098be2ae22916ff99a2433862d36d15190751ea265a80966299e93",
    "train/shard_002.bin": "be5dc730847658d1246f2abed71ef5b9edc3184745fcfed61c948836c95af0f1",
    "train/shard_003.bin": "f41ff473f12f7151e306fe36d35fcad06518e6c8234b5f9deb4b9fe9cb959b90",
    "val/shard_000.bin": "c0e7ac4cac64b546a309a030450a1136dbcedbf0e057b7569b9184f5236c543b",
}

# The tree's description names what differs between checkouts and machines: the input's name and
# its fingerprint (size and mtime), the Python version, the tool's version. Those are masked; every
# other byte of both files is compared here. Issue 28: re-recorded for the card's metadata (license,
# language) and the input named below its root, not by its absolute path.
DESCRIPTION = (STATS_JSON_NAME, CARD_NAME)
SAMPLE_DESCRIPTION_HASHES = {
    STATS_JSON_NAME: "210fb564e9941e71c49363cff8b7e219527241f1baca64f4c7b605908e4e5906",
    CARD_NAME: "b9efbf79cf670e2826668bbdb9e18ef33f1cdcade36c4b479929206f3a9c8cfc",
}
SCAFFOLD_DESCRIPTION_HASHES = {
    STATS_JSON_NAME: "2eb901ed0bac95a1b6a54d581975d3375b205d521afbd169a095c5153f6fd199",
    CARD_NAME: "d2af75d3d80a76d6be4d44d4709ad27b23e4d37618eca7a33af9592e39d2b863",
}


def description_hashes(out) -> dict[str, str]:
    doc = json.loads((out / STATS_JSON_NAME).read_text(encoding="utf-8"))
    (url, fingerprint), = ((i["url"], i["fingerprint"]) for i in doc["inputs"])
    masks = {url: "<input>", fingerprint: "<fingerprint>", doc["versions"]["python"]: "<python>",
             doc["versions"]["beam-pretokenize"]: "<version>"}
    hashes = {}
    for name in DESCRIPTION:
        text = (out / name).read_text(encoding="utf-8")
        for value, mask in masks.items():
            text = text.replace(value, mask)
        hashes[name] = hashlib.sha256(text.encode()).hexdigest()
    return hashes


def test_the_bucketed_sample_is_byte_for_byte_what_it_was(tmp_path):
    # make demo's command
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "out"), *RUNNER]) == 0
    assert tree_hashes(tmp_path / "out", skip=DESCRIPTION) == SAMPLE_HASHES
    assert description_hashes(tmp_path / "out") == SAMPLE_DESCRIPTION_HASHES


def test_the_scaffold_sample_is_byte_for_byte_what_it_was(tmp_path):
    # make demo-scaffold's command
    src = REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"
    flags = ["--tokenizer", "gpt2", "--shard-tokens", "4000", *RUNNER]
    assert cli.main(["scaffold", "--input", str(src), "--output", str(tmp_path / "out"), *flags]) == 0
    assert tree_hashes(tmp_path / "out", skip=DESCRIPTION) == SCAFFOLD_HASHES
    assert description_hashes(tmp_path / "out") == SCAFFOLD_DESCRIPTION_HASHES
