"""The paper's nine topic labels (docs/design.md §4; paper, appendix "Clustered Sampling Details").

Defined once here and imported by ``ebpo.annotate.topic`` (the labellers) and ``ebpo.tasks.arith`` (one
arith topic per label), so the two can never disagree.
"""

from __future__ import annotations

# In the paper's order.
TOPICS: tuple[str, ...] = (
    "Algebra & Number Theory",
    "Calculus & Analysis",
    "Geometry & Trigonometry",
    "Discrete Mathematics",
    "Probability & Statistics",
    "Linear Algebra",
    "Applied Mathematics & Word Problems",
    "Physics & Chemistry",
    "Advanced Mathematics",
)

__all__ = ["TOPICS"]
