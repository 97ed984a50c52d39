"""ca.utils.checkpoint: activation checkpointing (see compiled_autograd/autograd/checkpoint.py)."""
from compiled_autograd.autograd.checkpoint import (CheckpointError, CheckpointPolicy,
                                         SelectiveCheckpointContext, checkpoint,
                                         checkpoint_sequential,
                                         create_selective_checkpoint_contexts,
                                         set_checkpoint_debug_enabled,
                                         set_checkpoint_early_stop)

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointError", "CheckpointPolicy",
           "SelectiveCheckpointContext", "create_selective_checkpoint_contexts",
           "set_checkpoint_debug_enabled", "set_checkpoint_early_stop"]
