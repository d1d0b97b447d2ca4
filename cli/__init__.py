"""hrmctl: one terminal for a small training cluster on a LAN."""

__version__ = "0.1.0"
