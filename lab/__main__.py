"""`python -m lab up N` keeps a lab of N nodes for manual work (prints its token, inventory and nodes);
`python -m lab down TOKEN` removes it. Root only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lab.nodes import STATE_DIR, Lab, _remove, write_state


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "up":
        lab = Lab(int(argv[2])).up()
        write_state(lab.token, {"pid": 1, "n": lab.n})  # keep it
        print(json.dumps({"token": lab.token, "inventory": str(lab.inventory),
                          "nodes": {n.name: n.ip for n in lab.nodes}}))
    elif len(argv) >= 3 and argv[1] == "down":
        tok = argv[2]
        n = json.loads((STATE_DIR / f"{tok}.json").read_text()).get("n", 16)
        _remove(tok, [f"hrm{tok}n{i}" for i in range(n)], [f"hrm{tok}n{i}" for i in range(n)], f"hrb{tok}",
                Path(f"/tmp/hrmlab-{tok}"))
    else:
        print("usage: python -m lab up N | down TOKEN", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
