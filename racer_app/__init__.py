"""App helpers for RACER Studio (app.py): session state, settings and limits, formatting and
the event handlers. Decoding logic lives in `racer` (the race scheduler in `racer.race`);
figures in `visuals`."""
from .models import ModelStore
from .session import Session, Trace
from .settings import Limits, Settings, allowed_models_from_env, default_settings, validate

__all__ = ["ModelStore", "Session", "Trace", "Limits", "Settings", "allowed_models_from_env",
           "default_settings", "validate"]
