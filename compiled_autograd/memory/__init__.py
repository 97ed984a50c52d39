"""ca.memory: accounting of tensor storage (``profile``), the planned schedule of a
traced backward (``schedule``) and the reports (``report``)."""
from compiled_autograd.memory.profile import (CATEGORIES, Event, category, profile,
                                              retag_saved, source)

__all__ = ["profile", "category", "source", "retag_saved", "CATEGORIES", "Event"]
