"""Models: the tiny Llama and character tokenizer built locally (``tiny``: the base model's architecture, and
random models for tests and benchmarks) and the ``arith`` base model (``recipe``, ``sft``, ``base_model``,
``grid``, ``cli``)."""
