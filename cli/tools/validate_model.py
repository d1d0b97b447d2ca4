"""`hrmctl validate-model`: a language model built from the trainer's keys and checked before a run
(auralm.tools.validate_model.check)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli.tools.common import JsonOut, user_errors


def validate_model(overrides: Annotated[Optional[list[str]], typer.Argument(
                       metavar="KEY=VALUE", show_default=False,
                       help="The trainer's keys of the model to check (default: task=lm model=rlm-tiny), e.g. "
                            "model=rlm-small model.mhc_flows=2.")] = None,
                   json_out: JsonOut = False) -> int:
    """Check a language model before training: forward, backward, parameters, mHC's matrices, a tiny batch overfit.

    Each check is a line with ok or FAIL (docs/rlm.md, "validate-model").
    Exit 0 when every check passes, 1 when one fails, 2 for bad keys or a model this machine cannot hold."""
    import json

    with user_errors():
        from auralm.tools.validate_model import check

        report = check(list(overrides or []))
    if json_out:
        print(json.dumps({"model": report["model"], "ok": report["ok"], "checks": report["checks"]}))
    else:
        print(f"model {report['model']} ({report['family']})")
        for r in report["checks"]:
            print(f"  {'ok  ' if r['ok'] else 'FAIL'} {r['check']}: {r['detail']}")
        print("all checks passed" if report["ok"] else "some checks failed")
    return 0 if report["ok"] else 1
