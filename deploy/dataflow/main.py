"""The Flex Template's entry point: runs one job with the template's parameters as its flags.

Dataflow's launcher calls ``python main.py --input=... --output=... --runner=DataflowRunner ...``.
``--job=scaffold`` (a template parameter) picks the scaffold job; the default is the bucketed job.
"""

import sys

from pipelines import cli


def main(argv: list[str]) -> int:
    job, rest = "bucketed", []
    for arg in argv:
        if arg.startswith("--job="):
            job = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return cli.main([job, *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
