"""`nvmon profiles`: the simulator's board profiles and the `--sim` syntax, as plain text or JSON.

The syntax is nvmon.sim.scenario's docstring (one text for the code and the command); its reST
marks (``X``, `X`, `::`) are taken out here so that a terminal shows plain text.
"""

from __future__ import annotations

import json
import re
import textwrap

import click

PROFILE_KEYS = ("name", "description", "gpu", "gpus", "nvlink", "ib_ports", "ib_rate_gbps")


def plain_rest(text: str, width: int = 96) -> str:
    """reST as a terminal shows it: ``X`` and `X` → X, a paragraph's closing `::` → `:`;
    flowing paragraphs refilled to `width`, indented blocks (examples, tables) kept as they are."""
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`]+)`", r"\1", text)
    text = re.sub(r"\s*::$", ":", text, flags=re.MULTILINE)
    out = []
    for para in textwrap.dedent(text).strip().split("\n\n"):
        lines = para.split("\n")
        if all(line.startswith(" ") for line in lines if line):
            out.append(para)
        else:  # a flowing paragraph, maybe ending in a heading line such as "Keys (...):"
            head = [lines.pop()] if len(lines) > 1 and lines[-1].rstrip().endswith(":") else []
            out.append("\n".join([textwrap.fill(" ".join(line.strip() for line in lines), width),
                                   *(h.strip() for h in head)]))
    return "\n\n".join(out)


def sim_syntax() -> str:
    from nvmon.sim import scenario

    return plain_rest(scenario.__doc__.split("Syntax:", 1)[1])


def profile_dict(p) -> dict:
    fabric = {"nvswitch": "NVSwitch", "pairs": "NVLink pairs", "none": "none"}.get(p.fabric, p.fabric)
    return {"name": p.key, "description": p.description, "gpu": p.gpu_name, "gpus": p.gpus, "nvlink": fabric,
            "ib_ports": p.ib_ports, "ib_rate_gbps": p.ib_rate_gbps}


@click.command("profiles")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (its keys are listed above).")
def profiles_command(as_json: bool) -> None:
    """List the simulator's board profiles and the --sim syntax.

    \b
    --json keys:
      profiles    a list: name (the --sim profile name); description; gpu (the
                  model as NVML names it); gpus; nvlink (NVSwitch, NVLink pairs
                  or none); ib_ports; ib_rate_gbps
      sim_syntax  the --sim syntax as plain text
    """
    from nvmon.sim.profiles import PROFILES

    if as_json:
        out = {"profiles": [profile_dict(p) for p in PROFILES.values()], "sim_syntax": sim_syntax()}
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    for p in PROFILES.values():
        click.echo(f"  {p.key:<11} {p.description}")
    click.echo("\n--sim syntax: " + sim_syntax())
