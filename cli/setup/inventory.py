"""`hrmctl init`: write hrmctl.toml from the hosts given (or the Host entries of ~/.ssh/config), then try SSH to
each and say, for a node whose key login fails, the one command that fixes it.

A host given as `user@address:port` keeps its user and port; a name that ~/.ssh/config knows is resolved by it at
every later command, so only its name is written. The inventory's python is the venv `hrmctl setup` builds
(`<workdir>/.venv/bin/python`). An existing inventory is never overwritten without --force.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cli.errors import HrmctlError, InventoryError
from cli.nodes.inventory import INVENTORY_NAME, _load_ssh_config, load_inventory
from cli.nodes.remote import Outcome, for_each

WORKDIR = "~/hrmctl"
HOST = re.compile(r"\A(?:(?P<user>[^@\s:]+)@)?(?P<host>[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?\Z")
NAME = re.compile(r"[^A-Za-z0-9_\-]")  # a TOML bare key: a dot would nest tables


@dataclass
class HostSpec:
    name: str
    host: str
    user: str | None = None
    port: int | None = None
    from_ssh_config: bool = False


def parse_hosts(text: str) -> list[HostSpec]:
    specs, seen = [], set()
    for item in [h.strip() for h in text.split(",")]:
        m = HOST.match(item)
        if not item or m is None:
            raise InventoryError(f"--hosts: '{item}' is not a host; give a comma-separated list like "
                                 "--hosts 192.168.1.10,aura@laptop1:2222")
        port = int(m["port"]) if m["port"] else None
        if port is not None and not 1 <= port <= 65535:
            raise InventoryError(f"--hosts: port {port} of '{item}' is not 1-65535")
        host = m["host"].strip("[]")
        name = NAME.sub("-", host)
        if name in seen:
            raise InventoryError(f"--hosts: '{host}' is named twice; name each host once")
        seen.add(name)
        specs.append(HostSpec(name=name, host=host, user=m["user"], port=port))
    return specs


def ssh_config_hosts() -> list[HostSpec]:
    cfg, _ = _load_ssh_config()
    if cfg is None:
        return []
    names = [h for h in cfg.get_hostnames() if not any(c in h for c in "*?!") and h not in ("localhost",)]
    return [HostSpec(name=NAME.sub("-", h), host=h, from_ssh_config=True) for h in names]


def _host_line(s: HostSpec) -> str | None:
    """A Host of ~/.ssh/config is resolved by it (HostName, User, Port, IdentityFile) when the table names no
    host: the node's name is its alias. An alias that has no HostName is the address itself."""
    if s.from_ssh_config and s.name == s.host:
        return None
    return f'host = "{s.host}"'


def render(specs: list[HostSpec], workdir: str = WORKDIR) -> str:
    lines = ["# Written by `hrmctl init`. Every key: README.md, section \"The inventory\".",
             "", "[defaults]", f'workdir = "{workdir}"', f'python = "{workdir}/.venv/bin/python"  # built by hrmctl setup',
             'data_dir = "data"', ""]
    for s in specs:
        lines.append(f"[nodes.{s.name}]")
        host = _host_line(s)
        lines.append(host if host else "# host, user, port and key: from its Host entry in ~/.ssh/config")
        if s.user:
            lines.append(f'user = "{s.user}"')
        if s.port:
            lines.append(f"port = {s.port}")
        lines.append("")
    return "\n".join(lines)


def _try(session) -> str:
    res = session.run(["uname", "-sm"], timeout=20)
    return res.stdout.strip() or res.last_line()


def init(hosts: str | None, *, path: str | None, force: bool, check: bool, accept_new_host_keys: bool,
         console, err, copy_id: bool = False) -> int:
    target = Path(path or INVENTORY_NAME).expanduser()
    if target.exists() and not force:
        raise HrmctlError(f"{target} exists; hrmctl init does not overwrite an inventory: edit it, or pass --force "
                          "to replace it")
    specs = parse_hosts(hosts) if hosts else ssh_config_hosts()
    if not specs:
        raise HrmctlError("no hosts: name them with --hosts a,b (user@address:port each), or add Host entries to "
                          "~/.ssh/config")
    text = render(specs)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, target)
    console.print(f"wrote {target}: {', '.join(s.name for s in specs)}"
                  + (" (from ~/.ssh/config)" if not hosts else ""), markup=False, highlight=False)
    if not check:
        return 0
    inv = load_inventory(target)
    outcomes = for_each(list(inv.nodes.values()), _try, accept_new_host_keys=accept_new_host_keys)
    refused = [o.node for o in outcomes if not o.ok and "authentication failed" in (o.error or "")]
    if copy_id and refused:
        for node in refused:
            copy_key(node, console)
        again = {o.node.name: o for o in for_each(refused, _try, accept_new_host_keys=accept_new_host_keys)}
        outcomes = [again.get(o.node.name, o) for o in outcomes]
    return report(outcomes, console, err)


def copy_key(node, console) -> None:
    """OpenSSH's ssh-copy-id for one node: it asks for the password itself (on this terminal) and installs the
    public key; hrmctl never sees the password."""
    import shutil
    import subprocess

    if shutil.which("ssh-copy-id") is None:
        raise HrmctlError("ssh-copy-id is not installed here (apt-get install openssh-client); install your key "
                          f"on {node.name} by hand: append ~/.ssh/id_ed25519.pub to its ~/.ssh/authorized_keys")
    argv = ["ssh-copy-id", "-p", str(node.port)]
    if node.identity_file:
        argv += ["-i", node.identity_file[0] + (".pub" if not node.identity_file[0].endswith(".pub") else "")]
    console.print(f"{node.name}: installing your public key with `{' '.join(argv)} {node.user}@{node.host}` "
                  "(ssh asks for the password)", markup=False, highlight=False)
    subprocess.call([*argv, f"{node.user}@{node.host}"])


def report(outcomes: list[Outcome], console, err) -> int:
    failed = 0
    for o in outcomes:
        if o.ok:
            console.print(f"{o.node.name}: ssh ok ({o.value})", markup=False, highlight=False)
            continue
        failed += 1
        err.print(o.error, markup=False, highlight=False, soft_wrap=True)  # it names the node
    if failed:
        err.print(f"{failed} of {len(outcomes)} nodes cannot be reached with a key yet; after the fix above, "
                  "`hrmctl nodes --check`, then `hrmctl setup`", markup=False, highlight=False, soft_wrap=True)
        return 1
    console.print("next: hrmctl setup", markup=False, highlight=False)
    return 0
