"""The academic sentence splitter: tricky cases with exact expected output, and properties on QASPER."""

from __future__ import annotations

import re

import pytest

from arag.ingest.splitter import split_sentences
from conftest import qasper_paragraphs

CASES: list[tuple[str, list[str]]] = [
    # Abbreviations that never end a sentence.
    (
        "This was shown by Vaswani et al. Their model uses attention.",
        ["This was shown by Vaswani et al. Their model uses attention."],
    ),
    (
        "As seen in Fig. 3, accuracy rises. It then drops.",
        ["As seen in Fig. 3, accuracy rises.", "It then drops."],
    ),
    (
        "See Figs. 2 and 3 for details. We discuss them next.",
        ["See Figs. 2 and 3 for details.", "We discuss them next."],
    ),
    ("We minimise Eq. 4 with Adam. Training is fast.", ["We minimise Eq. 4 with Adam.", "Training is fast."]),
    (
        "Combining Eqs. (2) and (3) gives the loss. It is convex.",
        ["Combining Eqs. (2) and (3) gives the loss.", "It is convex."],
    ),
    (
        "We use a small model, i.e. BERT-base. It has 110M parameters.",
        ["We use a small model, i.e. BERT-base.", "It has 110M parameters."],
    ),
    (
        "Some tasks (e.g. NER) are easy. Others are hard.",
        ["Some tasks (e.g. NER) are easy.", "Others are hard."],
    ),
    (
        "This differs from prior work (cf. Smith). We explain why.",
        ["This differs from prior work (cf. Smith).", "We explain why."],
    ),
    ("The best runs –i.e. TC2015– win. We see why.", ["The best runs –i.e. TC2015– win.", "We see why."]),
    (
        "We compare LSTM vs. Transformer encoders. The latter wins.",
        ["We compare LSTM vs. Transformer encoders.", "The latter wins."],
    ),
    ("We removed URLs, emojis, etc. before training.", ["We removed URLs, emojis, etc. before training."]),
    ("We removed URLs, emojis, etc. Then we trained.", ["We removed URLs, emojis, etc.", "Then we trained."]),
    (
        "The corpus has approx. 5 million tokens. It is public.",
        ["The corpus has approx. 5 million tokens.", "It is public."],
    ),
    ("Details are in Sec. 4. The code is public.", ["Details are in Sec. 4.", "The code is public."]),
    (
        "Results are in Tab. 2 and Sec. 5.1. We discuss them.",
        ["Results are in Tab. 2 and Sec. 5.1.", "We discuss them."],
    ),
    (
        "It was funded by Grant No. EP/E501214/1 of EPSRC.",
        ["It was funded by Grant No. EP/E501214/1 of EPSRC."],
    ),
    ("P and R rise (resp. Fall) with k. We explain.", ["P and R rise (resp. Fall) with k.", "We explain."]),
    ("It was sold in the U.S. The price fell.", ["It was sold in the U.S.", "The price fell."]),
    ("The U.S. Army funded it. We thank them.", ["The U.S. Army funded it.", "We thank them."]),
    (
        "We take gradients w.r.t. Theta only. This is cheap.",
        ["We take gradients w.r.t. Theta only.", "This is cheap."],
    ),
    (
        "We thank Dr. Smith and Prof. Jones. Mr. Brown helped too.",
        ["We thank Dr. Smith and Prof. Jones.", "Mr. Brown helped too."],
    ),
    # Initials.
    (
        "The Transformer of A. Vaswani changed NLP. It is everywhere.",
        ["The Transformer of A. Vaswani changed NLP.", "It is everywhere."],
    ),
    ("We quote J. R. R. Tolkien here. Nothing more.", ["We quote J. R. R. Tolkien here.", "Nothing more."]),
    ("The proof is in Appendix A. The code follows.", ["The proof is in Appendix A.", "The code follows."]),
    (
        "Examples are shown in Fig. 1 A. We also applied it.",
        ["Examples are shown in Fig. 1 A.", "We also applied it."],
    ),
    # Numbers, versions, URLs.
    (
        "As Table 3 shows, we win. Section 4.2 explains.",
        ["As Table 3 shows, we win.", "Section 4.2 explains."],
    ),
    ("The kappa is 0.95 overall. Agreement is high.", ["The kappa is 0.95 overall.", "Agreement is high."]),
    (
        "Accuracy rose by 3.5% on test. That is significant.",
        ["Accuracy rose by 3.5% on test.", "That is significant."],
    ),
    (
        "We use spaCy v1.2.3 with Python 3.11. Both are free.",
        ["We use spaCy v1.2.3 with Python 3.11.", "Both are free."],
    ),
    (
        "Code is at github.com/x/y and arxiv.org hosts the paper. Enjoy.",
        ["Code is at github.com/x/y and arxiv.org hosts the paper.", "Enjoy."],
    ),
    ("Write to a.b@uni.edu for data. We reply fast.", ["Write to a.b@uni.edu for data.", "We reply fast."]),
    (
        "The dataset is on arxiv.org. The model is on github.com.",
        ["The dataset is on arxiv.org.", "The model is on github.com."],
    ),
    ("We got 10 points in 2019. 2020 was better.", ["We got 10 points in 2019.", "2020 was better."]),
    # Ellipses.
    (
        "The words w1, w2, ... Wn are tokens. They are embedded.",
        ["The words w1, w2, ... Wn are tokens.", "They are embedded."],
    ),
    (
        "It could be one of INLINEFORM8 , INLINEFORM9 , ... INLINEFORM11 here.",
        ["It could be one of INLINEFORM8 , INLINEFORM9 , ... INLINEFORM11 here."],
    ),
    # QASPER placeholders.
    ("This is shown in BIBREF12. We then train.", ["This is shown in BIBREF12.", "We then train."]),
    (
        "Prior work BIBREF12, BIBREF13 used CRFs. We do not.",
        ["Prior work BIBREF12, BIBREF13 used CRFs.", "We do not."],
    ),
    (
        "Results are in TABREF3 . Figure FIGREF1 shows more.",
        ["Results are in TABREF3 .", "Figure FIGREF1 shows more."],
    ),
    (
        "The loss is INLINEFORM0. DISPLAYFORM0 It is minimised.",
        ["The loss is INLINEFORM0.", "DISPLAYFORM0 It is minimised."],
    ),
    ("See SECREF2. EQREF5 defines the score.", ["See SECREF2.", "EQREF5 defines the score."]),
    # Closing quotes and brackets.
    (
        "We follow BERT (see BIBREF3). The results hold.",
        ["We follow BERT (see BIBREF3).", "The results hold."],
    ),
    ('He called it "a toy." The name stuck.', ['He called it "a toy."', "The name stuck."]),
    ("(We tried this first.) Then we stopped.", ["(We tried this first.)", "Then we stopped."]),
    # Questions, exclamations, lower-case continuation.
    ("Does it work? Yes, mostly. Wow! It does.", ["Does it work?", "Yes, mostly.", "Wow!", "It does."]),
    ("Is it fast? it is not.", ["Is it fast? it is not."]),
    ("We tokenize. then we tag.", ["We tokenize. then we tag."]),
    ("The answer was (a). (b) was wrong.", ["The answer was (a).", "(b) was wrong."]),
    ('The label was "no." "Yes" was rarer.', ['The label was "no."', '"Yes" was rarer.']),
    # Newlines.
    (
        "First paragraph ends here.\n\nSecond starts here.",
        ["First paragraph ends here.", "Second starts here."],
    ),
    ("A heading\n\nbody text follows", ["A heading", "body text follows"]),
    (
        "We follow the approach of\nSmith and Jones in all runs.",
        ["We follow the approach of\nSmith and Jones in all runs."],
    ),
    ("The data were noisy.\nWe cleaned them.", ["The data were noisy.", "We cleaned them."]),
    ("Three steps:\n- tokenize\n- tag", ["Three steps:", "- tokenize", "- tag"]),
    (
        "Figure 1: The pipeline\nThe encoder reads text.",
        ["Figure 1: The pipeline", "The encoder reads text."],
    ),
    ("The method is\nsimple and fast.", ["The method is\nsimple and fast."]),
    # LaTeX math is never split.
    ("We define $x. Y$ as the score. It is bounded.", ["We define $x. Y$ as the score.", "It is bounded."]),
    (
        "Let $\n\\sum _i x_i\n$ be the sum. It is positive.",
        ["Let $\n\\sum _i x_i\n$ be the sum.", "It is positive."],
    ),
    # Degenerate input.
    ("", []),
    ("   \n ", []),
    ("No terminal punctuation", ["No terminal punctuation"]),
    ("  Leading and trailing space.  ", ["Leading and trailing space."]),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0][:40] for c in CASES])
def test_split_cases(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_enough_cases() -> None:
    assert len(CASES) >= 40


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _qasper_paragraphs(n_papers: int = 40) -> list[str]:
    return qasper_paragraphs(n_papers)


def test_reconstruction_on_qasper() -> None:
    paragraphs = _qasper_paragraphs()
    assert len(paragraphs) >= 300
    n_sentences = 0
    for para in paragraphs:
        sentences = split_sentences(para)
        n_sentences += len(sentences)
        assert all(s and s == s.strip() for s in sentences)
        assert _collapse(" ".join(sentences)) == _collapse(para)
    # Academic paragraphs average several sentences: a splitter that never splits fails here.
    assert n_sentences > 2 * len(paragraphs)


ABBREV_ENDINGS = re.compile(r"(?:\bet al\.|\bFigs?\.|\be\.g\.|\bi\.e\.|\bEqs?\.|\bcf\.|\bvs\.)$")


def test_no_split_after_abbreviation_on_qasper() -> None:
    # The last sentence ends where the paragraph ends; every other end is a split the splitter chose.
    offenders = [s for p in _qasper_paragraphs() for s in split_sentences(p)[:-1] if ABBREV_ENDINGS.search(s)]
    assert offenders == []


def test_lower_starts_lets_a_sentence_begin_in_lower_case_and_keeps_the_abbreviations() -> None:
    text = "It uses, e.g. the base model [1]. word2vec is used. Smith et al. report runs. J. smith wrote."
    assert split_sentences(text) == [
        "It uses, e.g. the base model [1]. word2vec is used.",
        "Smith et al. report runs.",
        "J. smith wrote.",
    ]
    assert split_sentences(text, lower_starts=True) == [
        "It uses, e.g. the base model [1].",
        "word2vec is used.",
        "Smith et al. report runs.",
        "J. smith wrote.",
    ]
