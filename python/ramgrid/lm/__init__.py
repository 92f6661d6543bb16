"""The reference experiment as a library: a unigram language model in the grid, scored from Dask tasks.

    ramgrid demo lm                          # or: python -m ramgrid.lm --corpus sentences.txt.gz
    python examples/lm_score.py              # the same job, written out as a short script

Modules: `corpus` (staging, tokenising, sampling sentences from wordfreq), `count` (the counting job, on
`ramgrid.mapreduce`), `model` (log probabilities and the load into the grid), `score` (the scoring job and its
modes), `peers` (memcached), `experiment` (the whole run) and `report` (Table 1, Figures 5 and 6, the JSON result).
"""

from ramgrid.lm.corpus import CorpusError, StagedCorpus, stage_corpus, tokenize
from ramgrid.lm.model import UNK_KEY, LanguageModel, Smoothing, count_model, load_into_grid
from ramgrid.lm.score import RunResult, ScoringFailed, Source, reference_scores, run_scoring

__all__ = [
    "UNK_KEY",
    "CorpusError",
    "LanguageModel",
    "RunResult",
    "ScoringFailed",
    "Smoothing",
    "Source",
    "StagedCorpus",
    "count_model",
    "load_into_grid",
    "reference_scores",
    "run_scoring",
    "stage_corpus",
    "tokenize",
]
