"""ca.optim: torch.optim's optimizers and schedulers, on ca's Tensors.

``SGD``, ``Adam``, ``AdamW``, ``RMSprop``, ``Adagrad`` (``param_groups``, ``zero_grad``,
``step``, ``state_dict``, ``load_state_dict``, ``add_param_group``), ``lr_scheduler``,
and ``in_backward(optimizer)``: each parameter's update inside the backward.
"""
from compiled_autograd.optim import lr_scheduler
from compiled_autograd.optim.adagrad import Adagrad
from compiled_autograd.optim.adam import Adam, AdamW
from compiled_autograd.optim.in_backward import in_backward
from compiled_autograd.optim.optimizer import Optimizer
from compiled_autograd.optim.rmsprop import RMSprop
from compiled_autograd.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "lr_scheduler",
           "in_backward"]
