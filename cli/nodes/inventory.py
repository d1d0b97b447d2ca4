"""The node inventory: `hrmctl.toml` (or --inventory / HRMCTL_INVENTORY) plus ~/.ssh/config.

Every resolved value remembers where it came from, so `hrmctl nodes` can show it.
Precedence, highest first: the node's own table, `[defaults]`, ~/.ssh/config, built-in.
The file is checked against cli.nodes.schema (msgspec) before anything is merged: a wrong key,
type or value is one InventoryError line naming the file, the table and the key.
"""

from __future__ import annotations

import fnmatch
import getpass
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

from cli.errors import InventoryError
from cli.nodes import schema
from cli.nodes.schema import UNSET, NodeTable, TopTable

if TYPE_CHECKING:
    import paramiko

INVENTORY_NAME = "hrmctl.toml"
LOCAL_NAMES = ("localhost", "local")
NODE_KEYS = NodeTable.__struct_fields__

BUILTIN = {"port": 22, "python": "python3", "workdir": "~/hrmctl", "data_dir": "data", "nproc": "auto"}


@dataclass
class Node:
    """One machine of the cluster, fully resolved."""

    name: str
    host: str
    user: str
    port: int = 22
    identity_file: list[str] = field(default_factory=list)
    python: str = "python3"
    workdir: str = "~/hrmctl"
    data_dir: str = "data"
    nproc: str | int = "auto"
    threads: int | None = None  # OMP_NUM_THREADS of each of its processes (None: its usable CPUs / its processes)
    ifname: str | None = None
    known_hosts: list[str] = field(default_factory=list)
    proxy_command: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    slurm_job: str | None = None  # a node of this Slurm allocation: reached with srun (cli/nodes/srun.py), not SSH

    @property
    def is_local(self) -> bool:
        return self.host in LOCAL_NAMES

    @property
    def reached_by(self) -> str:
        """"local" (this machine), "srun" (a node of the Slurm allocation this runs in) or "ssh"."""
        return "local" if self.is_local else "srun" if self.slurm_job else "ssh"

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def data_path(self) -> str:
        """data_dir, relative paths taken from workdir (as the trainer sees them)."""
        if self.data_dir.startswith(("/", "~")):
            return self.data_dir
        return f"{self.workdir.rstrip('/')}/{self.data_dir}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "host": self.host, "user": self.user, "port": self.port,
            "identity_file": self.identity_file, "python": self.python, "workdir": self.workdir,
            "data_dir": self.data_dir, "nproc": self.nproc, "threads": self.threads,
            "ifname": self.ifname,
            "known_hosts": self.known_hosts, "local": self.is_local, "sources": self.sources,
        }


@dataclass
class Inventory:
    path: Path | None
    nodes: dict[str, Node]
    master: str | None
    ssh_config: paramiko.SSHConfig | None
    ssh_config_path: Path | None
    defaults: dict[str, Any] = field(default_factory=dict)
    known_hosts: list[str] = field(default_factory=list)

    def resolve(self, name: str) -> Node:
        """The node called `name`: from the inventory, localhost, or ~/.ssh/config."""
        if name in self.nodes:
            return self.nodes[name]
        if name in LOCAL_NAMES:
            return local_node(name)
        if self.ssh_config is not None and _ssh_config_names(self.ssh_config, name):
            return _build_node(name, {}, self.defaults, self.ssh_config, self.known_hosts)
        ssh_hosts = [h for h in (self.ssh_config.get_hostnames() if self.ssh_config else ())
                     if "*" not in h and "?" not in h and not h.startswith("!")]
        hint = _nearest(name, list(self.nodes) + ssh_hosts + list(LOCAL_NAMES))
        where = f"the inventory {self.path}" if self.path else "an inventory (no hrmctl.toml here)"
        raise InventoryError(
            f"unknown node '{name}': not in {where} (nodes: {', '.join(self.nodes) or 'none'}) "
            "nor a Host in ~/.ssh/config"
            + (f"; did you mean '{hint}'?" if hint else f"; add it under [nodes.{name}] with its host")
        )

    def select(self, spec: str | None) -> list[Node]:
        """Nodes named by `--nodes a,b` (master first), or all of them, or this machine alone."""
        if spec is None:
            names = list(self.nodes) or ["localhost"]
        else:
            names = [n.strip() for n in spec.split(",")]
            if not spec.strip() or any(not n for n in names):
                raise InventoryError(
                    f"--nodes '{spec}' has an empty name; give a comma-separated list like --nodes node0,node1"
                )
            seen = set()
            for n in names:
                if n in seen:
                    raise InventoryError(f"node '{n}' is named twice in --nodes '{spec}'; name each node once")
                seen.add(n)
        nodes = [self.resolve(n) for n in names]
        if self.master and self.master in names:
            nodes.sort(key=lambda n: n.name != self.master)
        return nodes


def local_node(name: str = "localhost") -> Node:
    """This machine, run without SSH."""
    src = "built-in (local)"
    return Node(
        name=name, host="localhost", user=getpass.getuser(), port=0, python=sys.executable,
        workdir=os.getcwd(), data_dir="data", nproc="auto",
        sources={k: src for k in ("host", "user", "python", "workdir", "data_dir", "nproc")},
    )


_nearest = schema.nearest


def _ssh_config_names(cfg: paramiko.SSHConfig, name: str) -> bool:
    """True when a Host pattern other than a bare wildcard matches `name`."""
    for pattern in cfg.get_hostnames():
        if pattern in ("*",) or pattern.startswith("!"):
            continue
        if fnmatch.fnmatch(name, pattern):
            return True
    return False


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _build_node(name: str, own: dict, defaults: dict, cfg: paramiko.SSHConfig | None,
                top_known_hosts: list[str], path: Path | None = None) -> Node:
    """Merge the layers for one node and record where each value came from."""
    ssh: dict[str, Any] = {}
    if cfg is not None:
        looked = cfg.lookup(str(own.get("host", defaults.get("host", name))))
        if "hostname" in looked:
            ssh["host"] = looked["hostname"]
        if "user" in looked:
            ssh["user"] = looked["user"]
        if "port" in looked:
            ssh["port"] = looked["port"]
        if "identityfile" in looked:
            ssh["identity_file"] = looked["identityfile"]
        if "userknownhostsfile" in looked:
            ssh["known_hosts"] = looked["userknownhostsfile"].split()
        if "proxycommand" in looked:
            ssh["proxy_command"] = looked["proxycommand"]

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    builtin = dict(BUILTIN, user=getpass.getuser())
    for key in NODE_KEYS + ("proxy_command",):
        for label, layer in (("inventory", own), ("defaults", defaults), ("ssh config", ssh),
                             ("built-in", builtin)):
            if key in layer:
                values[key] = layer[key]
                sources[key] = label
                break
    if "known_hosts" not in values and top_known_hosts:
        values["known_hosts"] = top_known_hosts
        sources["known_hosts"] = "inventory"
    where = schema.one_line(f"{path or 'inventory'}: node '{name}'")
    if "host" not in values:
        raise InventoryError(f"{where} has no host; add host = \"<address>\" under [nodes.{name}]")
    port = values["port"]
    if sources["port"] == "ssh config":  # text there; the inventory's own value is checked already
        port = schema.ssh_config_port(port, where)
    ident = [os.path.expanduser(p) for p in _as_list(values.get("identity_file"))]
    if sources.get("identity_file") in ("inventory", "defaults"):
        for p in ident:
            if not os.path.isfile(p):
                raise InventoryError(schema.one_line(
                    f"{where}: identity_file {p} does not exist; fix the path, or remove it to use your agent and default keys"
                ))
    known = [os.path.expanduser(p) for p in _as_list(values.get("known_hosts"))]
    if not known:
        known = [os.path.expanduser("~/.ssh/known_hosts")]
        sources["known_hosts"] = "built-in"
    return Node(
        name=name, host=str(values["host"]), user=str(values["user"]),
        port=port, identity_file=ident,
        python=str(values["python"]), workdir=str(values["workdir"]),
        data_dir=str(values["data_dir"]), nproc=values["nproc"], threads=values.get("threads"),
        ifname=values.get("ifname"), known_hosts=known,
        proxy_command=values.get("proxy_command"), sources=sources,
    )


def _load_ssh_config() -> tuple[paramiko.SSHConfig | None, Path | None]:
    path = Path(os.path.expanduser("~/.ssh/config"))
    if not path.is_file():
        return None, None
    import paramiko  # only when ~/.ssh/config exists: a Slurm or local launch does not import it

    try:
        return paramiko.SSHConfig.from_path(str(path)), path
    except Exception as exc:  # paramiko raises several types for bad configs
        raise InventoryError(f"{path}: cannot read ssh config ({exc}); fix the file or move it aside") from None


def find_inventory(explicit: str | os.PathLike | None) -> Path | None:
    """--inventory, else HRMCTL_INVENTORY, else ./hrmctl.toml; None when there is none."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise InventoryError(f"inventory {path} does not exist; check the path given to --inventory / HRMCTL_INVENTORY")
        return path
    env = os.environ.get("HRMCTL_INVENTORY")
    if env:
        return find_inventory(env)
    here = Path.cwd() / INVENTORY_NAME
    return here if here.is_file() else None


def _read_toml(path: Path) -> dict[str, Any]:
    """The file parsed, or one line: the file, and the parser's message with its line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(schema.one_line(f"{path}: cannot read the inventory ({exc})")) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        if "end of document" in msg and "line" not in msg:
            last = text.rsplit("\n", 1)[-1]
            msg = msg.replace("end of document", f"end of document, line {text.count(chr(10)) + 1}, "
                                                 f"column {len(last) + 1}")
        raise InventoryError(schema.one_line(f"{path}: not valid TOML: {msg}; fix that line")) from None
    except RecursionError:
        msg = "arrays or tables nested too deeply"
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        msg = f"a value out of range ({exc})"
    raise InventoryError(schema.one_line(f"{path}: not valid TOML for hrmctl: {msg}"))


def load_inventory(explicit: str | os.PathLike | None = None) -> Inventory:
    path = find_inventory(explicit)
    cfg, cfg_path = _load_ssh_config()
    if path is None:
        return Inventory(path=None, nodes={}, master=None, ssh_config=cfg, ssh_config_path=cfg_path)
    top = schema.check(_read_toml(path), TopTable, path, "")
    defaults = schema.check(top.defaults, NodeTable, path, "[defaults]").given()
    top_known = [os.path.expanduser(p) for p in _as_list(None if top.known_hosts is UNSET else top.known_hosts)]
    nodes: dict[str, Node] = {}
    for name, own in top.nodes.items():
        schema.check_name(name, path)
        table = schema.check(own, NodeTable, path, schema.table_label(name)).given()
        nodes[name] = _build_node(name, table, defaults, cfg, top_known, path)
    master = None if top.master is UNSET else top.master
    if master is not None and master not in nodes:
        hint = _nearest(master, list(nodes))
        raise InventoryError(schema.one_line(
            f"{path}: master = {schema.shown(master)} is not a node of this inventory"
            + (f"; did you mean '{hint}'?" if hint else f"; nodes: {', '.join(nodes) or 'none'}")
        ))
    return Inventory(path=path, nodes=nodes, master=master, ssh_config=cfg, ssh_config_path=cfg_path,
                     defaults=defaults, known_hosts=top_known)
