"""Models: the tiny Llama and character tokenizer built locally (``tiny``: the base model's architecture, and
random models for tests and benchmarks), the built-in base models' recipes side by side (``recipes``: S1 ``arith``,
S2 ``gym``), their build (``build``, ``sft``, ``kernels``, ``grid``), their names (``names``, ``paths``) and
``cli``."""
