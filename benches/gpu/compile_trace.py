"""Compile an RMM-format CSV log (plain or .gz) into "a|f SLOT SIZE" lines for rmm_replay."""

from __future__ import annotations

import csv
import gzip
import sys


def main(src: str, dst: str) -> None:
    opener = gzip.open if src.endswith(".gz") else open
    slots: dict[str, int] = {}
    sizes: dict[str, int] = {}
    free_slots: list[int] = []
    next_slot = 0
    with opener(src, "rt") as f, open(dst, "w") as out:
        for row in csv.DictReader(f):
            action, ptr, size = row["Action"].strip(), row["Pointer"].strip(), int(row["Size"])
            if action == "allocate":
                if ptr in slots:
                    continue
                if free_slots:
                    slot = free_slots.pop()
                else:
                    slot, next_slot = next_slot, next_slot + 1
                slots[ptr], sizes[ptr] = slot, size
                out.write(f"a {slot} {size}\n")
            elif action == "free" and ptr in slots:
                slot = slots.pop(ptr)
                out.write(f"f {slot} {sizes.pop(ptr)}\n")
                free_slots.append(slot)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
