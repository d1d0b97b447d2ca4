"""RLM, the RLM-mHC guide's transformer (rlm-* sizes): ``model.py`` the model, ``spec.py`` its declaration; the
hyper-connections are ``auralm.models.mhc``."""
