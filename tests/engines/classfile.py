"""What a Java class file declares and which members of other classes it uses, read from the class
file format (JVMS chapter 4) without a JVM: enough to check that the jars of a closure link.

``Closure`` indexes a set of jars by class name and resolves a reference the way the JVM does:
the member in the named class, else in its superclasses, else in its superinterfaces. A lookup that
walks out of the closure into the JDK (java/..., javax/..., jdk/..., sun/...) is taken as resolved:
the JDK's own classes are not in the jars.
"""

from __future__ import annotations

import dataclasses
import struct
import zipfile
from functools import cache
from pathlib import Path

JDK_PACKAGES = ("java/", "javax/", "jdk/", "sun/")

# Constant pool tags (JVMS 4.4) and the size of each entry after its tag byte.
UTF8, CLASS, FIELDREF, METHODREF, INTERFACE_METHODREF, NAME_AND_TYPE = 1, 7, 9, 10, 11, 12
_FIXED_SIZE = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}
_MEMBER_KINDS = {FIELDREF: "field", METHODREF: "method", INTERFACE_METHODREF: "method"}


@dataclasses.dataclass(frozen=True)
class Reference:
    """A use of member ``name`` with ``descriptor`` of class ``owner`` (names with slashes)."""

    kind: str  # field or method
    owner: str
    name: str
    descriptor: str

    def __str__(self) -> str:
        return f"{self.owner.replace('/', '.')}.{self.name} {self.descriptor}"


@dataclasses.dataclass(frozen=True)
class ClassFile:
    name: str
    super_name: str | None
    interfaces: tuple[str, ...]
    members: frozenset[tuple[str, str]]  # (name, descriptor) of every field and method it declares
    classes_used: frozenset[str]
    references: frozenset[Reference]


def parse(data: bytes) -> ClassFile:
    """The class in ``data``, the bytes of a .class file."""
    if data[:4] != b"\xca\xfe\xba\xbe":
        raise ValueError("not a class file")
    (count,) = struct.unpack_from(">H", data, 8)
    pool: dict[int, tuple] = {}
    pos, index = 10, 1
    while index < count:
        tag = data[pos]
        if tag == UTF8:
            (length,) = struct.unpack_from(">H", data, pos + 1)
            pool[index] = (UTF8, data[pos + 3:pos + 3 + length].decode("utf-8", "surrogatepass"))
            pos += 3 + length
        elif tag == CLASS:
            pool[index] = (tag, *struct.unpack_from(">H", data, pos + 1))
            pos += 3
        elif tag in (FIELDREF, METHODREF, INTERFACE_METHODREF, NAME_AND_TYPE):
            pool[index] = (tag, *struct.unpack_from(">HH", data, pos + 1))
            pos += 5
        else:  # constants and method handles: nothing a reference check reads
            pool[index] = (tag,)
            pos += 1 + _FIXED_SIZE[tag]
        index += 2 if tag in (5, 6) else 1  # a long or a double takes two slots
    _, this, super_index, n_interfaces = struct.unpack_from(">HHHH", data, pos)
    interfaces = struct.unpack_from(f">{n_interfaces}H", data, pos + 8)
    pos += 8 + 2 * n_interfaces
    members = set()
    for _table in ("fields", "methods"):
        (n,) = struct.unpack_from(">H", data, pos)
        pos += 2
        for _ in range(n):
            _, name, descriptor, n_attributes = struct.unpack_from(">HHHH", data, pos)
            pos += 8
            for _ in range(n_attributes):
                pos += 6 + struct.unpack_from(">I", data, pos + 2)[0]
            members.add((pool[name][1], pool[descriptor][1]))

    def class_name(i: int) -> str:
        return pool[pool[i][1]][1]

    references = set()
    for tag, *fields in pool.values():
        if tag in _MEMBER_KINDS:
            owner, name_and_type = fields
            _, name, descriptor = pool[name_and_type]
            references.add(Reference(_MEMBER_KINDS[tag], class_name(owner), pool[name][1], pool[descriptor][1]))
    return ClassFile(
        name=class_name(this),
        super_name=class_name(super_index) if super_index else None,
        interfaces=tuple(class_name(i) for i in interfaces),
        members=frozenset(members),
        classes_used=frozenset(class_name(i) for i, entry in pool.items() if entry[0] == CLASS),
        references=frozenset(references),
    )


def classes_in(jar: Path) -> list[ClassFile]:
    """Every class of ``jar`` (not those of other Java releases under META-INF/versions)."""
    with zipfile.ZipFile(jar) as z:
        return [parse(z.read(n)) for n in z.namelist()
                if n.endswith(".class") and not n.startswith("META-INF/") and not n.endswith("module-info.class")]


class Closure:
    """The classes of a set of jars, looked up by name (each parsed when first needed)."""

    def __init__(self, jars: list[Path]):
        self._where: dict[str, tuple[Path, str]] = {}
        for jar in jars:
            with zipfile.ZipFile(jar) as z:
                for n in z.namelist():
                    if n.endswith(".class") and not n.startswith("META-INF/"):
                        self._where.setdefault(n[:-len(".class")], (jar, n))
        self.get = cache(self._get)

    def _get(self, name: str) -> ClassFile | None:
        if name not in self._where:
            return None
        jar, entry = self._where[name]
        with zipfile.ZipFile(jar) as z:
            return parse(z.read(entry))

    def has_class(self, name: str) -> bool:
        return name.startswith(JDK_PACKAGES) or name.startswith("[") or name in self._where

    def resolves(self, ref: Reference) -> bool:
        """Whether ``ref`` names a member the closure declares in its owner or the owner's supertypes."""
        seen: set[str] = set()
        todo = [ref.owner]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name.startswith(JDK_PACKAGES) or name.startswith("["):
                return True  # inherited from the JDK (Enum.ordinal, Object.clone on an array, ...)
            found = self.get(name)
            if found is None:
                return False
            if (ref.name, ref.descriptor) in found.members:
                return True
            if ref.name == "<init>":
                return False  # a constructor is never inherited
            todo += [*found.interfaces, *([found.super_name] if found.super_name else [])]
        return False


def unresolved(users: list[ClassFile], closure: Closure, into: str) -> list[str]:
    """The references (and classes) of ``users`` into the package prefix ``into`` that ``closure``
    does not have, sorted; empty when every one links."""
    missing = set()
    for user in users:
        missing |= {f"class {c}" for c in user.classes_used if c.startswith(into) and not closure.has_class(c)}
        missing |= {f"{r.kind} {r}" for r in user.references if r.owner.startswith(into) and not closure.resolves(r)}
    return sorted(missing)
