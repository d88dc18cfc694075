"""The DIOPI operator table as installed with the shim (diopi_table.yaml)."""
from dataclasses import dataclass
from pathlib import Path

import yaml

from ditorch.dipu import _C

TABLE_PATH = Path(_C.__file__).resolve().parent / "diopi_table.yaml"


@dataclass(frozen=True)
class TableEntry:
    aten: str  # ATen operator, name.overload
    diopi: str  # DIOPI function name
    opinfo: tuple  # OpInfo names whose samples exercise it


def diopi_table() -> list[TableEntry]:
    with open(TABLE_PATH) as f:
        rows = yaml.safe_load(f)
    return [
        TableEntry(aten=row["aten"], diopi=row["diopi"].split("(")[0].strip(), opinfo=tuple(row.get("opinfo") or ()))
        for row in rows
    ]
