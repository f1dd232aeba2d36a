"""After training: a run's model out of its checkpoints (:mod:`~hpctrain.saved.weights`), as a
plain file (:mod:`~hpctrain.saved.export`), scored on any split (:mod:`~hpctrain.saved.evaluate`)."""
from hpctrain.saved.spec import SavedModelError, read_spec
from hpctrain.saved.weights import load_model, run_weights

__all__ = ["SavedModelError", "load_model", "read_spec", "run_weights"]
