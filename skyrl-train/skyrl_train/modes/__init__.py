"""One training loop per ``trainer.async_mode``, each readable top to bottom in its own file.

- :mod:`~skyrl_train.modes.sync`: generate, then learn, then sync.
- :mod:`~skyrl_train.modes.one_step_off`: the next step's rollouts generate while this step learns.
- :mod:`~skyrl_train.modes.fully_async`: a stream of groups never stops generating; steps take from it.

Each loop calls the same two halves of a step, :meth:`~skyrl_train.trainer.Trainer.collect` (experience) and
:meth:`~skyrl_train.trainer.Trainer.learn` (prepare, update, weight sync), and hands every step's metrics to its
:class:`~skyrl_train.modes.base.LoopHost` (the run), which evaluates, checkpoints and exports.
"""

from skyrl_train.modes.base import LoopHost, Schedule

__all__ = ["LoopHost", "Schedule"]
