"""The learning benchmark: methods x group size G x budget variant x seeds on a testbed, paired by seed.

    python -m benchmarks.learning --quick                  # smoke matrix (a few minutes on 2 cores)
    python -m benchmarks.learning --plan                   # cells, runs and projected time; runs nothing
    python -m benchmarks.learning --select-options         # picks ebpo-best on the selection seeds
    python -m benchmarks.learning                          # the matrix, resumable; then the report
    python -m benchmarks.learning --report-only            # tables and plots from the finished runs

One run trains a method from the testbed's base model (``--testbed``: ``s1``, the model and ``arith`` task of
``src/ebpo/configs/ebpo.yaml``; ``s2``, the gym base model on its reasoning-gym mixture) through the trainer's
public API (``ebpo.trainer.load_config`` + ``Trainer``), validating every ``eval_every`` steps, then tests the
final checkpoint on its task's test set (avg@n Pass@1 and maj@n, per topic and level). Every size not given on
the command line is ``src/ebpo/configs/ebpo.yaml``'s, frozen into the run's spec when the matrix is planned.

Modules: ``methods`` (the two arms, ``ebpo-best`` and its selection), ``spec`` (budget, budget variants,
cells, run specs and keys), ``testbeds`` (base model and task), ``run`` (one run: train, test, resume), ``matrix`` (plan, process pool,
estimate), ``stats`` (t-intervals, paired differences, AUC, steps to threshold), ``report`` (markdown,
CSV, plots), ``cli``. The design, the definitions and the measured cost per run: docs/benchmarks.md.
"""
