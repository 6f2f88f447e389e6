"""Similarity across a cohort's assessments: pairs that share more than the starter gives them.

    multigpu similarity [--grading grading] [--threshold 0.5]

Every collected ``grading/submitted/<student>/assessments/train.py`` is fingerprinted with
copydetect (winnowed k-grams of the tokens, names and comments normalised away, so renaming
variables changes nothing), the starter's fingerprints removed (every learner starts from it).
A pair is listed when the code one shares with the other, as a fraction of the first's code
outside the starter, reaches the threshold for either of the two. A listed pair is a lead for a
person, never a verdict: two learners who follow the same lesson write similar conversions.
"""

from __future__ import annotations

import io
import itertools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

#: Tokens of a k-gram (copydetect's noise threshold: shorter matches are ignored).
NOISE_TOKENS = 25
#: Any match at least this long is found (copydetect's guarantee threshold).
GUARANTEE_TOKENS = 30
#: The shared fraction (of one submission's code outside the starter) from which a pair is listed.
THRESHOLD = 0.5


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    similarity_a: float  # the fraction of a's code (outside the starter) that b shares
    similarity_b: float
    tokens: int  # shared tokens

    @property
    def similarity(self) -> float:
        return max(self.similarity_a, self.similarity_b)


def _fingerprint(text: str, name: str, boilerplate=None):
    from copydetect import CodeFingerprint

    return CodeFingerprint(f"{name}.py", NOISE_TOKENS, GUARANTEE_TOKENS - NOISE_TOKENS + 1,
                           boilerplate=boilerplate, fp=io.StringIO(text))


def pairs(sources: dict[str, str], starter: str, threshold: float = THRESHOLD) -> list[Pair]:
    """The pairs of ``sources`` (name -> code) that share at least ``threshold`` of either one's
    code outside ``starter``, most similar first."""
    import numpy as np
    from copydetect import compare_files

    boilerplate = np.array(sorted(_fingerprint(starter, "starter").hashes))
    prints = {name: _fingerprint(text, name, boilerplate) for name, text in sorted(sources.items())}
    found = []
    for a, b in itertools.combinations(prints, 2):
        if not prints[a].hashes or not prints[b].hashes:  # nothing beyond the starter
            continue
        tokens, (sim_a, sim_b), _ = compare_files(prints[a], prints[b])
        if max(sim_a, sim_b) >= threshold:
            found.append(Pair(a, b, round(float(sim_a), 3), round(float(sim_b), 3), int(tokens)))
    return sorted(found, key=lambda p: -p.similarity)


def cohort(grading: str | os.PathLike) -> dict[str, str]:
    """student -> the assessment script collected for them (``grading/submitted``)."""
    from multigpu.grading import official

    submitted = Path(grading) / "submitted"
    out = {}
    for script in sorted(submitted.glob(f"*/{official.ASSIGNMENT}/train.py")) if submitted.is_dir() else []:
        out[script.parent.parent.name] = script.read_text(errors="replace")
    return out


def report(grading: str | os.PathLike, threshold: float = THRESHOLD) -> tuple[list[Pair], Path]:
    """The similar pairs of a cohort, also written to ``grading/results/similarity.json``."""
    from multigpu.grading import grader

    found = pairs(cohort(grading), grader.STARTER.read_text(), threshold)
    out = Path(grading) / "results" / "similarity.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"threshold": threshold, "pairs": [asdict(p) for p in found]}, indent=2) + "\n")
    return found, out
