"""The one command that gives a node the Python hrmctl setup needs, for that node's distribution."""

from __future__ import annotations

# /etc/os-release ID or ID_LIKE -> the command (python3 with its venv module)
COMMANDS = (
    (("debian", "ubuntu"), "sudo apt-get install -y python3 python3-venv"),
    (("fedora", "rhel", "centos", "rocky", "almalinux"), "sudo dnf install -y python3"),
    (("arch",), "sudo pacman -S --noconfirm python"),
    (("opensuse", "suse", "sles"), "sudo zypper install -y python3"),
    (("alpine",), "sudo apk add python3"),
)


def install_command(os_release: str) -> tuple[str, str]:
    """(distribution name, command) from the text of /etc/os-release."""
    fields = {}
    for line in os_release.splitlines():
        key, _, value = line.partition("=")
        fields[key.strip()] = value.strip().strip('"')
    ids = [fields.get("ID", "")] + fields.get("ID_LIKE", "").split()
    name = fields.get("PRETTY_NAME") or fields.get("ID") or "an unknown distribution"
    for keys, command in COMMANDS:
        if any(i in keys for i in ids):
            return name, command
    return name, "install Python >= 3.10 with its venv module from your distribution"


def missing_python_line(session, node: str, problem: str) -> str:
    """One line: the node, what is missing, and the exact command for its distribution."""
    try:
        text = session.run(["cat", "/etc/os-release"], timeout=15).stdout
    except Exception:  # the line is still useful without the distribution
        text = ""
    name, command = install_command(text)
    return f"{node}: {problem}; on {node} ({name}) run: {command}"
