"""HRM, the Hierarchical Reasoning Model (hrm-* sizes): ``model.py`` its core, ``spec.py`` its declaration; the ACT
wrapper and the blocks it shares with TRM are in ``auralm.models.act``, their keys in ``auralm.models.recurrent``."""
