"""The ``keyword`` topic backend: weighted regular-expression rules, the label with the highest score."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ebpo.annotate.topic.labels import DEFAULT_TOPIC, TOPICS, strip_instruction

# (label, weight, pattern): a problem's score for a label is the sum of the weights of the distinct
# patterns that match it (case-insensitive). Written from the topics' usual vocabulary.
KEYWORD_RULES: tuple[tuple[str, float, str], ...] = (
    (
        "Algebra & Number Theory",
        1.0,
        r"\bprimes?\b|\bdivisors?\b|\bdivisible\b|\bdivides\b|\\mid\b|\bmodulo\b|\bmod\b|\bremainder\b",
    ),
    (
        "Algebra & Number Theory",
        1.0,
        r"\bgcd\b|greatest common divisor|\blcm\b|relatively prime|\bdigits?\b|\bintegers? solutions?\b",
    ),
    (
        "Algebra & Number Theory",
        1.0,
        r"\bpolynomials?\b|\broots?\b|\bfactor\b|\bsimplify\b|\bequations?\b|\binequalit",
    ),
    (
        "Algebra & Number Theory",
        1.0,
        r"functions? f|f\s*\(\s*x\s*\+|\\log|\blogarithm|complex number|\bsolve\b",
    ),
    (
        "Calculus & Analysis",
        2.0,
        r"\bderivative|\bdifferentiable|\bintegral\b|\\int\b|\\lim\b|\blimit\b|\bcontinuous\b",
    ),
    (
        "Calculus & Analysis",
        1.5,
        r"\bconverge|\bseries\b|\\sum_\{n\s*=\s*1\}\^\{?\\infty|\btangent line\b|\brate of change\b",
    ),
    (
        "Geometry & Trigonometry",
        1.5,
        r"\btriangles?\b|\bcircles?\b|\bpolygon|\bsquare\b|\brectangle|\bhexagon|\bpentagon|\boctagon|\bnonagon|-gon\b",
    ),
    (
        "Geometry & Trigonometry",
        1.5,
        r"\bangles?\b|\\angle|\bperimeter\b|\barea\b|\bradius\b|\bdiameter\b|\bcircumcenter|\bincenter|\bpyramid|\bcylinder|\bcube\b|\bsphere|\bcone\b",
    ),
    (
        "Geometry & Trigonometry",
        1.5,
        r"\\sin\b|\\cos\b|\\tan\b|\\cot\b|\\sec\b|\\csc\b|\barc(sin|cos|tan)|\\arc(sin|cos|tan)|\btrigonometr|\bdegrees?\b|\^\\circ",
    ),
    (
        "Geometry & Trigonometry",
        1.0,
        r"\bparabola|\bslope\b|\bcoordinates?\b|\bmidpoint|\bxy-plane|\bplane\b|\blattice points?\b|\bvertex|\bvertices\b",
    ),
    (
        "Discrete Mathematics",
        1.5,
        r"how many ways|number of ways|\barrangements?\b|\bpermutations?\b|\bsubsets?\b|\bcolou?r(ed|ing|ings)?\b",
    ),
    (
        "Discrete Mathematics",
        1.5,
        r"\bgrid\b|\bpaths?\b|\bgraph\b|\bgames?\b|\bplayers?\b|\bturns?\b|\bsequence of\b|\bpalindrom|\bchessboard|\btiling|\bboard\b",
    ),
    (
        "Discrete Mathematics",
        1.0,
        r"\bcompute the number of\b|\bfind the number of\b|\bhow many\b|\bbinary\b|\\binom|\bchoose\b|\bpigeonhole",
    ),
    (
        "Probability & Statistics",
        3.0,
        r"\bprobabilit|\bexpected (value|number)|\bat random\b|\brandomly\b|\bequally likely\b|\bdice\b|\bdie\b|\bcoins?\b",
    ),
    (
        "Probability & Statistics",
        2.5,
        r"\bmean\b|\bmedian\b|\bmode\b|\bstandard deviation|\bvariance\b|\baverage\b",
    ),
    (
        "Linear Algebra",
        3.0,
        r"\bmatri(x|ces)\b|\\begin\{pmatrix\}|\\mathbf\{|\bvectors?\b|\bdeterminant|\beigen|\bprojection\b|\bdot product|\bcross product",
    ),
    (
        "Applied Mathematics & Word Problems",
        2.0,
        r"\\\$|\bdollars?\b|\bcents?\b|\bprice|\bcost|\binterest\b|\bwage|\bsavings\b|\bpercent|\bprofit",
    ),
    (
        "Applied Mathematics & Word Problems",
        1.5,
        r"\bminutes?\b|\bhours?\b|\bmiles?\b|\bspeed\b|\bpounds?\b|\bcups?\b|\bbooks?\b|\bstudents?\b|\bworkers?\b|\bshelf|\bshelves|\bweighs?\b",
    ),
    (
        "Physics & Chemistry",
        3.0,
        r"\bforce\b|\bacceleration\b|\bvelocity\b|\bmomentum\b|\benergy\b|\bphysics\b|\bchemi|\bmolecul|\bjoules?\b|\bnewtons?\b|\bvoltage|\bcurrent\b|\bmass of\b",
    ),
    (
        "Advanced Mathematics",
        3.0,
        r"\bgroup homomorphism|\bisomorphi|\babelian\b|\bring\b|\bfield extension|\btopolog|\bmanifold|\bdifferential equation|\bgalois\b|\bmeasure theory",
    ),
)


@dataclass
class KeywordTopicClassifier:
    """Label = argmax over topics of the summed weights of matching rules (:data:`KEYWORD_RULES`).

    Ties go to the earlier topic in :data:`TOPICS`; no match gives ``default`` (Algebra & Number Theory).
    """

    rules: Sequence[tuple[str, float, str]] = KEYWORD_RULES
    default: str = DEFAULT_TOPIC
    _compiled: list[tuple[str, float, re.Pattern[str]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for topic, _, _ in self.rules:
            if topic not in TOPICS:
                raise ValueError(
                    f"keyword rule for unknown topic {topic!r}; valid topics: {', '.join(TOPICS)}"
                )
        self._compiled = [(t, w, re.compile(p, re.IGNORECASE)) for t, w, p in self.rules]

    def scores(self, text: str) -> dict[str, float]:
        """Per-topic score of one problem."""
        score = dict.fromkeys(TOPICS, 0.0)
        for topic, weight, pattern in self._compiled:
            if pattern.search(text):
                score[topic] += weight
        return score

    def label_one(self, text: str) -> str:
        score = self.scores(strip_instruction(text))
        best = max(score.values())
        if best <= 0:
            return self.default
        return next(t for t in TOPICS if score[t] == best)

    def label(self, texts: Sequence[str]) -> list[str | None]:
        return [self.label_one(t) for t in texts]
