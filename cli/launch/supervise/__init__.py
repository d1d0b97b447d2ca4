"""The launch's last stage: the whole job over its attempts (job.py: restarts, the plan made again, a node's leave
and return), its record (status.py), its detached supervisor (detach.py) and what the user reads of it (report.py,
ddp_report.py). May import every earlier stage; cli/launch/__init__.py lists the modules."""
