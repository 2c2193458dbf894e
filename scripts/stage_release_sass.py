"""Shared-memory loads still in flight at a stage release, from a compiled kernel's SASS.

For every mbarrier arrive (SYNCS.ARRIVE*) the script walks back through the listing to the previous arrive, fence
or barrier (SYNCS.ARRIVE, MEMBAR, BAR) and lists the LDS instructions in between none of whose destination registers
is read before the arrive: the warp issues the arrive without having waited for those loads (a load's result is
waited for at its first use), so a TMA into the stage released by the arrive could overwrite what they read. Which
stage a load reads shows in its shared-memory offset (the stage region: sfa, sfb, ...) and in whether the arrive
frees the stage waited for last (the release right after the promotion) or an earlier one (a deferred release,
whose loads in flight read the stage waited for since). The walk is linear (branches in between are counted).

    python scripts/stage_release_sass.py KERNEL.cubin [...]          # one line per arrive, the loads in flight
"""

import re
import sys

from deep_kernels.testing.sass import sass

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
REGISTER = re.compile(r"\bR(\d+)\b")
# Barrier-like instructions that end the backward walk (a MEMBAR waits for the thread's earlier loads).
STOP = ("SYNCS.ARRIVE", "MEMBAR", "BAR")


def instructions(text: str) -> list:
    """(address, predicate, opcode, operands) of each SASS instruction, in listing order."""
    return [(m.group(1), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()) for m in INSTRUCTION.finditer(text)]


def destination_registers(opcode: str, operands: str) -> set:
    first = operands.split(",")[0].strip()
    match = REGISTER.fullmatch(first)
    if not match:
        return set()
    width = {"64": 2, "128": 4}.get(opcode.split(".")[-1], 1)
    return {int(match.group(1)) + i for i in range(width)}


def source_registers(operands: str) -> set:
    parts = operands.split(",")
    return {int(r) for part in parts[1:] for r in REGISTER.findall(part)} | (
        {int(r) for r in REGISTER.findall(parts[0])} if "[" in parts[0] else set())


def loads_in_flight(listing: list) -> list:
    """(arrive, [(LDS address, its text), ...], branches between) for every arrive."""
    report = []
    for i, (address, predicate, opcode, operands) in enumerate(listing):
        if not opcode.startswith("SYNCS.ARRIVE"):
            continue
        in_flight, branches = [], 0
        read = set()
        for j in range(i - 1, -1, -1):
            _, _, op, ops = listing[j]
            if op.startswith(STOP):
                break
            if op.startswith("BRA") or op.startswith("BSYNC"):
                branches += 1
            if op.startswith("SYNCS.PHASECHK"):
                in_flight.append((listing[j][0], "(wait) " + f"{op} {ops}"))
            if op.startswith("LDS") and not (destination_registers(op, ops) & read):
                in_flight.append((listing[j][0], f"{op} {ops}"))
            read |= source_registers(ops)
        report.append(((address, f"{predicate} {opcode} {operands}".strip()), in_flight, branches))
    return report


def main():
    for path in sys.argv[1:]:
        print(path)
        for (address, text), in_flight, branches in loads_in_flight(instructions(sass(path))):
            loads = "; ".join(f"{a}: {t}" for a, t in in_flight) or "none"
            count = sum(not t.startswith("(wait)") for _, t in in_flight)
            print(f"  {address}: {text}  | LDS in flight: {count} ({loads})" +
                  (f" [{branches} branches between]" if branches else ""))


if __name__ == "__main__":
    main()
