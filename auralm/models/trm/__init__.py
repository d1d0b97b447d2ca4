"""TRM, the Tiny Recursive Model (trm-* sizes): ``model.py`` its core, ``spec.py`` its declaration; the ACT wrapper
and the blocks it shares with HRM are in ``auralm.models.act``, their keys in ``auralm.models.recurrent``."""
