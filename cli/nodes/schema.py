"""The schema of `hrmctl.toml`, checked by msgspec: which keys a table may hold and what each holds.

NodeTable   `[defaults]` and every `[nodes.NAME]`: host, user, port, identity_file, python, workdir,
            data_dir, nproc, threads, ifname, known_hosts; a key left out is UNSET (the next layer decides)
TopTable    the top level: master, known_hosts, [defaults], [nodes]
NodeName    what a node may be called: ASCII letters, digits, '-', '_' and '.'
check(...)  a table -> its Struct, or one InventoryError line naming the file, the table, the key,
            what the key must hold and what it held (unknown keys get the nearest valid one)

Every constraint is in the types below (msgspec.Meta: ranges, patterns, the text shown to the user
as `description`); this module adds only the wording. Conversion is strict: a TOML string is not
taken for a number, nor a number for a string. A key whose type is a list also takes one value.
Keep a pattern-constrained str out of any Union with a list, dict, set or tuple (see Paths).

Why msgspec and not pydantic, which the CLI carries too (typer converts options with it, so every command but
--help imports it): measured (issue 35), with pydantic already imported, checking a two-node hrmctl.toml took
93 ms min / 137 ms median here (msgspec: this module's import and check) against 360 / 471 ms for the same types
as pydantic v2 models (their schemas are built at import), 12 runs each on the 2-core machine at load ~14.
"""

from __future__ import annotations

import datetime
import difflib
import re
import typing
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from cli.errors import InventoryError

# No control characters (C0, DEL, C1): they would break a one-line message, a log or a command line.
_NO_CTRL = r"\x00-\x1f\x7f-\x9f"

Host = Annotated[str, Meta(
    pattern=rf"\A[^\s{_NO_CTRL}\-][^\s{_NO_CTRL}]*\Z",
    description="a host name or address (no spaces or control characters, not starting with '-')")]
User = Annotated[str, Meta(
    pattern=rf"\A[^\s{_NO_CTRL}\-][^\s{_NO_CTRL}]*\Z",
    description="a user name (no spaces or control characters, not starting with '-')")]
Port = Annotated[int, Meta(ge=1, le=65535, description="an integer from 1 to 65535")]
PathText = Annotated[str, Meta(pattern=rf"\A[^{_NO_CTRL}]+\Z",
                               description="a non-empty path without control characters")]
# One path or several: a list, and check() takes a single string for a list of one. Not
# Union[PathText, list[PathText]]: msgspec (<= 0.22; cf. its issue #717) misplaces the compiled pattern of a
# str that shares a union with a list, and the garbage collector then crashes the process at exit.
Paths = Annotated[list[PathText], Meta(
    description="a path, or a list of paths (non-empty text without control characters)")]
Command = Annotated[str, Meta(pattern=rf"\A[^{_NO_CTRL}]+\Z",
                              description="a command or path (non-empty text without control characters)")]
Nproc = Annotated[Union[Literal["auto"], Annotated[int, Meta(ge=1)]], Meta(
    description='"auto" or an integer >= 1')]
Threads = Annotated[int, Meta(ge=1, description="an integer >= 1")]
Ifname = Annotated[str, Meta(
    pattern=r"\A[A-Za-z0-9][A-Za-z0-9_.:\-]{0,14}\Z",
    description="a network interface name like \"eth0\" (1-15 ASCII letters, digits, '_', '.', ':', '-')")]
NodeName = Annotated[str, Meta(
    pattern=r"\A[A-Za-z0-9_.\-]+\Z", description="ASCII letters, digits, '-', '_' and '.' only")]
Master = Annotated[str, Meta(description="the name of a node of this inventory")]
Table = Annotated[dict[str, Any], Meta(description="a table")]


class NodeTable(Struct, forbid_unknown_fields=True):
    """`[defaults]` or `[nodes.NAME]`."""

    host: Union[Host, UnsetType] = UNSET
    user: Union[User, UnsetType] = UNSET
    port: Union[Port, UnsetType] = UNSET
    identity_file: Union[Paths, UnsetType] = UNSET
    python: Union[Command, UnsetType] = UNSET
    workdir: Union[PathText, UnsetType] = UNSET
    data_dir: Union[PathText, UnsetType] = UNSET
    nproc: Union[Nproc, UnsetType] = UNSET
    threads: Union[Threads, UnsetType] = UNSET
    ifname: Union[Ifname, UnsetType] = UNSET
    known_hosts: Union[Paths, UnsetType] = UNSET

    def given(self) -> dict[str, Any]:
        """The keys the table sets, with their values."""
        return {k: v for k in self.__struct_fields__ if (v := getattr(self, k)) is not UNSET}


class TopTable(Struct, forbid_unknown_fields=True):
    """The top level of the file; [defaults] and each [nodes.NAME] are checked as NodeTable."""

    master: Union[Master, UnsetType] = UNSET
    known_hosts: Union[Paths, UnsetType] = UNSET
    defaults: Table = {}
    nodes: Annotated[dict[str, Any], Meta(description="a table of nodes like [nodes.NAME]")] = {}
    slurm: Table = {}  # `hrmctl train --slurm`'s defaults, checked by cli/slurm/submit.py


def nearest(word: str, choices: list[str]) -> str | None:
    """The closest of `choices` to `word`, if one is close (long words are not compared: cost)."""
    if len(word) > 64:
        return None
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def one_line(text: str) -> str:
    """`text` with every character that could end a line or hide in a terminal escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown(value: Any, limit: int = 40) -> str:
    """A value as the message shows it: short, on one line, in TOML's words."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**18 else "a huge number"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else repr(value[:limit]) + "..."
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, (datetime.date, datetime.time)):
        return "a date/time"
    return type(value).__name__


def _settable(tp: Any) -> Any:
    """The type of a field without its UnsetType (what a table may set the key to)."""
    if typing.get_origin(tp) is Union:
        return next(arg for arg in typing.get_args(tp) if arg is not UnsetType)
    return tp


def _list_item(tp: Any) -> Any:
    """The item type when a field holds a list, else None."""
    tp = _settable(tp)
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return typing.get_args(tp)[0] if typing.get_origin(tp) is list else None


def expected(tp: Any) -> str:
    """The `description` of a field's type (through Union[..., UnsetType] and Annotated)."""
    tp = _settable(tp)
    for meta in getattr(tp, "__metadata__", ()):
        if isinstance(meta, Meta) and meta.description:
            return meta.description
    return "another type"


_INDEX = re.compile(r"at `\$\[(\d+)\]")


def check(table: Any, schema: type[Struct], path: Any, label: str) -> Any:
    """`table` converted to `schema`, or InventoryError: file, table (`label`), key, what it must be.

    `label` is how the message names the table, e.g. "[nodes.a]"; "" for the top level.
    """
    at = f"{path}: {label} " if label else f"{path}: "
    if not isinstance(table, dict):
        raise InventoryError(one_line(f"{at}must be a table, not {shown(table)}; see the README's inventory example"))
    fields = {f.name: f.type for f in msgspec.structs.fields(schema)}
    for key in table:
        if key not in fields:
            hint = nearest(key, list(fields))
            raise InventoryError(one_line(
                f"{path}: unknown key {shown(key)} in {label or 'the top level'}"
                + (f"; did you mean '{hint}'?" if hint else f"; valid keys: {', '.join(fields)}")))
    given = {k: [v] if isinstance(v, str) and _list_item(fields[k]) is not None else v for k, v in table.items()}
    try:
        return msgspec.convert(given, schema, strict=True)
    except msgspec.ValidationError as whole:
        for key, value in table.items():
            try:
                msgspec.convert(given[key], fields[key], strict=True)
            except msgspec.ValidationError as exc:
                name, bad, tp = key, value, fields[key]
                m = _INDEX.search(str(exc))
                if m and isinstance(value, list) and int(m.group(1)) < len(value):
                    name, bad, tp = f"{key}[{m.group(1)}]", value[int(m.group(1))], _list_item(tp)
                raise InventoryError(one_line(f"{at}{name} must be {expected(tp)}, not {shown(bad)}")) from None
        raise InventoryError(one_line(f"{at}{whole}")) from None


def table_label(name: str) -> str:
    """How a message names node `name`'s table: [nodes.a], or [nodes."a.b"] when the name has a dot."""
    return f'[nodes."{name}"]' if "." in name else f"[nodes.{name}]"


def check_name(name: str, path: Any) -> str:
    """A node's name (a key of [nodes]) checked against NodeName."""
    try:
        return msgspec.convert(name, NodeName, strict=True)
    except msgspec.ValidationError:
        raise InventoryError(one_line(
            f"{path}: node name {shown(name)} in [nodes] must be {expected(NodeName)}; rename that table")) from None


def ssh_config_port(value: Any, where: str) -> int:
    """A Port from ~/.ssh/config, where every value is text."""
    try:
        return msgspec.convert(value, Port, strict=False)
    except msgspec.ValidationError:
        raise InventoryError(one_line(
            f"{where}: port {shown(value)} from ~/.ssh/config must be {expected(Port)}; fix it there")) from None
