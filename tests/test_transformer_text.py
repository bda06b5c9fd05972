"""Transformer text plumbing: MLPerf BLEU (against sacrebleu), the reference subword tokenizer, the synthetic task."""
from __future__ import annotations

import math

import numpy as np
import pytest
import sacrebleu

from benchmarks.transformer import bleu, subword
from benchmarks.transformer.synthetic_language import SyntheticLanguage
from harness.errors import HarnessError

pytestmark = pytest.mark.quick

REFS = [
    "The quick brown fox jumps over the lazy dog.",
    "Der Preis stieg um 3,5 % auf 1.234,56 Euro.",
    "Er sagte: \"Das ist gut!\" und ging.",
    "Am 12. Mai 2014 (Montag) kam es zu Protesten in Kiew.",
    "Größere Änderungen an Straßen sind für 2015 geplant.",
    "E-Mail-Adressen wie info@example.com werden geprüft.",
    "Kosten: $4,000.00 + 19% MwSt. = ca. €4.760",
    "Das Ergebnis war 3:1 - ein klarer Sieg.",
    "Sie fragte, ob er käme; er antwortete nicht.",
    "«Ja», sagte sie — und lächelte…",
    "Die Temperatur liegt bei -5°C bis +3°C.",
    "Ein Weg/eine Straße führt nach Zürich.",
    "Er las das Buch „Krieg und Frieden“ in 3 Tagen.",
    "Die Jahre 1999-2001 waren schwierig.",
    "Hallo Welt",
    "Der Hund bellt laut.",
    "Wir sehen uns um 10.30 Uhr!",
    "Tokio ist die Hauptstadt von Japan.",
    "Das Café öffnet um 8 Uhr.",
    "50 % der Befragten stimmten zu, 30 % nicht.",
    "Versionen 2.0 und 3.1 sind kompatibel.",
    "Ärzte & Pfleger arbeiten #rund um die Uhr.",
    "Was? Wirklich?! Das glaube ich nicht...",
    "Die Firma (gegründet 1890) hat ~500 Mitarbeiter.",
    "a\\b und c|d sind Sonderzeichen.",
    "Ende.",
]
HYPS = [
    "the quick brown fox jumped over a lazy dog .",
    "Der Preis stieg um 3,5% auf 1.234,56 Euro.",
    "Er sagte: \"Das ist sehr gut!\" und ging weg.",
    "Am 12. Mai 2014 gab es Proteste in Kiew.",
    "GRÖSSERE ÄNDERUNGEN an Straßen sind für 2015 geplant.",
    "E-Mail-Adressen wie info@example.com werden geprüft.",
    "Kosten: $4,000 + 19 % MwSt = ca. €4.760",
    "Das Ergebnis war 3 : 1, ein klarer Sieg.",
    "Sie fragte ob er käme, er antwortete nicht",
    "«Ja», sagte sie.",
    "Die Temperatur liegt bei -5°C.",
    "Eine Straße führt nach Zürich.",
    "Er las „Krieg und Frieden“ in drei Tagen.",
    "Die Jahre 1999 - 2001 waren schwierig.",
    "hallo welt",
    "",
    "Wir sehen uns um 10.30 Uhr !",
    "Tokio",
    "Das Cafe öffnet um 8 Uhr.",
    "50 % stimmten zu, 30 % nicht.",
    "Versionen 2.0 und 3.1 sind kompatibel .",
    "Ärzte und Pfleger arbeiten rund um die Uhr.",
    "Was? Wirklich? Das glaube ich nicht.",
    "Die Firma hat etwa 500 Mitarbeiter (gegründet 1890).",
    "a\\b und c | d sind Sonderzeichen.",
    "ende .",
]


def _sacre(hyps, refs) -> float:
    return sacrebleu.corpus_bleu(hyps, [refs], lowercase=True, tokenize="intl").score / 100


# ---- BLEU -------------------------------------------------------------------------------------------------
def test_bleu_matches_sacrebleu_intl_lowercase():
    for hyps, refs in [(HYPS, REFS), (HYPS[:13], REFS[:13]), (HYPS[13:], REFS[13:]), (REFS, REFS),
                       (HYPS[::-1], REFS)]:
        ours = bleu.corpus_bleu(hyps, refs)
        assert ours == pytest.approx(_sacre(hyps, refs), abs=1e-9)
        assert 0.0 <= ours <= 1.0
    assert bleu.corpus_bleu(REFS, REFS) == pytest.approx(1.0)


def test_tokenize_matches_sacrebleu_intl():
    intl = sacrebleu.tokenizers.tokenizer_intl.TokenizerV14International()
    for line in REFS + HYPS:
        assert bleu.tokenize(line) == intl(line).split(), line


def test_bleu_hand_computed():
    # hyp: the cat sat on the mat / ref: the cat is on the mat (6 tokens each, so no brevity penalty)
    #   1-grams: the x2, cat, on, mat match; sat does not           -> 5/6
    #   2-grams: the-cat, on-the, the-mat match of 5                 -> 3/5
    #   3-grams: on-the-mat matches of 4                             -> 1/4
    #   4-grams: none of 3 match, smoothed to 1/(2^1 * 3)            -> 1/6
    #   BLEU = (5/6 * 3/5 * 1/4 * 1/6) ** (1/4) = (1/48) ** 0.25
    hyp, ref = ["The cat sat on the mat"], ["the cat is on the mat"]
    np.testing.assert_array_equal(bleu.bleu_stats(hyp, ref), [6, 6, 5, 3, 1, 0, 6, 5, 4, 3])
    assert bleu.corpus_bleu(hyp, ref) == pytest.approx((1 / 48) ** 0.25, abs=1e-12)
    assert bleu.corpus_bleu(hyp, ref) == pytest.approx(_sacre(hyp, ref), abs=1e-9)
    # Short hypothesis: 2/2 unigrams, 1/1 bigram, no 3/4-grams possible (left out, as the reference does;
    # sacrebleu would say 0 here), brevity penalty exp(1 - 6/2).
    assert bleu.corpus_bleu(["the cat"], ["the cat sat on the mat"]) == pytest.approx(math.exp(-2), abs=1e-12)


def test_bleu_stats_combine():
    a, b = slice(0, 11), slice(11, None)
    total = bleu.bleu_stats(HYPS[a], REFS[a]) + bleu.bleu_stats(HYPS[b], REFS[b])
    np.testing.assert_array_equal(total, bleu.bleu_stats(HYPS, REFS))
    assert total.dtype == np.float64 and total.shape == (10,)
    assert bleu.bleu_from_stats(total) == pytest.approx(bleu.corpus_bleu(HYPS, REFS), abs=1e-15)


def test_bleu_degenerate_cases():
    assert bleu.corpus_bleu([], []) == 0.0
    assert bleu.corpus_bleu([""], ["ein Satz ."]) == 0.0
    assert bleu.corpus_bleu(["", ""], ["", ""]) == 0.0
    assert bleu.bleu_from_stats(np.zeros(10)) == 0.0
    v = bleu.corpus_bleu(["etwas"], [""])  # no reference tokens at all
    assert math.isfinite(v) and 0.0 <= v <= 1.0
    # No match at all: the reference smooths 0/2 unigrams and 0/1 bigram to 1/4 each and skips the impossible
    # 3/4-grams, so a tiny wrong corpus scores (1/4 * 1/4) ** (1/4) * exp(1 - 3/2), not 0 (sacrebleu says 0).
    v = bleu.corpus_bleu(["völlig anders"], ["nichts gleich hier"])
    assert v == pytest.approx(0.5 * math.exp(-0.5), abs=1e-12)
    with pytest.raises(ValueError):
        bleu.corpus_bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError):
        bleu.bleu_from_stats(np.zeros(9))


# ---- subword ----------------------------------------------------------------------------------------------
BODY = (["hello_", "wor", "ld_", "a_", "c_", " ._", ", _", "\\\\", "\\u", "\\", "_", ";"]
        + list("0123456789abcdehlorwu ,.!"))


@pytest.mark.parametrize("reserved", ["underscore", "plain", "none"])
def test_subword_round_trip_and_reserved_ids(tmp_path, reserved):
    lines = {"underscore": ["<pad>_", "<EOS>_"] + BODY, "plain": ["<pad>", "<EOS>"] + BODY,
             "none": BODY}[reserved]
    path = str(tmp_path / "vocab.txt")
    subword.write_vocab_file(path, lines)
    tok = subword.Subtokenizer.from_file(path)
    expected_spelling = {"underscore": ("<pad>_", "<EOS>_"), "plain": ("<pad>", "<EOS>"), "none": None}[reserved]
    assert tok.reserved_spelling == expected_spelling
    assert tok.vocab_size == len(BODY) + 2
    assert tok.subtokens[subword.PAD_ID].startswith("<pad>") and tok.subtokens[subword.EOS_ID].startswith("<EOS>")
    assert tok.subtokens[2:] == BODY  # file order kept after the two reserved ids
    assert tok.encode("hello world") == [2, 3, 4]
    assert tok.encode("hello, world .") == [2, 8, 3, 4, 7]
    # "_", "\" and a character outside the alphabet ("é") are escaped as \u, \\ and \233;
    text = "a_b\\c é"
    ids = tok.encode(text)
    assert "".join(tok.subtokens[i] for i in ids) == "a_\\u_b_\\\\_c_\\233;_"
    assert subword.PAD_ID not in ids and subword.EOS_ID not in ids
    for s in [text, "hello world", "hello, world.", "  hello  world ", "", "x", "42 hello!\n"]:
        assert tok.decode(tok.encode(s)) == s, s
    # reserved, out-of-range and negative ids are skipped; numpy input is fine
    ids = tok.encode("hello world")
    assert tok.decode([0] + ids + [1, 10 ** 6, -3, 0]) == "hello world"
    assert tok.decode(np.array(ids + [1], np.int32)) == "hello world"
    assert tok.decode([]) == ""


def test_subword_plain_reserved_lines_anywhere_are_moved_to_the_front(tmp_path):
    path = str(tmp_path / "v")
    subword.write_vocab_file(path, BODY[:3] + ["<EOS>"] + BODY[3:] + ["<pad>"])
    tok = subword.Subtokenizer.from_file(path)
    assert tok.reserved_spelling == ("<pad>", "<EOS>") and tok.subtokens == ["<pad>", "<EOS>"] + BODY


def test_subword_errors(tmp_path):
    with pytest.raises(HarnessError, match="does not exist"):
        subword.Subtokenizer.from_file(str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    bad.write_text("'a_'\nb_\n", encoding="utf-8")
    with pytest.raises(HarnessError, match="line 2"):
        subword.Subtokenizer.from_file(str(bad))
    dq = tmp_path / "dq"
    dq.write_text('"<pad>_"\n"<EOS>_"\n"a_"\n', encoding="utf-8")
    assert subword.Subtokenizer.from_file(str(dq)).encode("a") == [2]


def test_split_tokens_matches_reference_rules():
    assert subword.split_tokens("Hello, world!") == ["Hello", ", ", "world", "!"]
    assert subword.split_tokens("a b  c") == ["a", "b", "  ", "c"]  # only a lone space is implied
    assert subword.split_tokens(" a") == [" ", "a"]                 # a leading space is kept
    assert subword.split_tokens("Zürich 2014") == ["Zürich", "2014"]


# ---- synthetic language -----------------------------------------------------------------------------------
def test_synthetic_is_deterministic_and_splits_are_disjoint():
    a, b = SyntheticLanguage(5), SyntheticLanguage(5)
    assert a.pairs("train", 200) == b.pairs("train", 200)
    assert a.pairs("train", 50) == a.pairs("train", 200)[:50]
    assert a.pairs("eval", 20) == a.pairs("eval", 100)[:20]
    assert SyntheticLanguage(6).pairs("train", 20) != a.pairs("train", 20)
    assert SyntheticLanguage(-1).pairs("train", 3)  # any int seed works
    train = {s for s, _ in a.pairs("train", 3000)}
    evals = [s for s, _ in a.pairs("eval", 300)]
    assert len(set(evals)) == 300 and not train & set(evals)
    with pytest.raises(HarnessError):
        a.pairs("test", 1)


def test_synthetic_vocab_and_sentences():
    lang = SyntheticLanguage(1)
    assert lang.decode([0, 1]) == "" and lang.vocab_size > 300
    pairs = lang.pairs("train", 500)
    src_len = [len(s.split()) for s, _ in pairs]
    assert min(src_len) >= 6 and max(src_len) <= 16 and 9 < np.mean(src_len) < 12
    src_words = {w for s, _ in pairs for w in s.split()}
    tgt_words = {w for _, t in pairs for w in t.split()}
    assert src_words & tgt_words == {"."}
    for s, t in pairs[:50]:
        assert lang.decode(lang.encode(s) + [subword.EOS_ID]) == s
        ids = lang.encode(t)
        assert all(2 <= i < lang.vocab_size for i in ids)
        assert lang.decode(ids) == t
    assert lang.decode([10 ** 6, -1]) == ""
    with pytest.raises(HarnessError):
        lang.encode("notaword")


def test_synthetic_vocab_file_reads_back_with_subtokenizer(tmp_path):
    lang = SyntheticLanguage(2)
    path = str(tmp_path / "synthetic.vocab")
    subword.write_vocab_file(path, lang.subtokens())
    tok = subword.Subtokenizer.from_file(path)
    assert tok.vocab_size == lang.vocab_size and tok.reserved_spelling == ("<pad>", "<EOS>")
    for s, t in lang.pairs("eval", 30):
        for text in (s, t):
            assert tok.encode(text) == lang.encode(text)  # one whole subtoken per word, same ids
            assert tok.decode(tok.encode(text)) == text


def test_synthetic_baselines():
    lang = SyntheticLanguage(0)
    pairs = lang.pairs("eval", 300)
    src, ref = [s for s, _ in pairs], [t for _, t in pairs]
    rng = np.random.default_rng(0)
    oracle = bleu.corpus_bleu([lang.translate(s, rng) for s in src], ref)
    gloss = bleu.corpus_bleu([lang.gloss(s) for s in src], ref)
    assert 0.9 < oracle < 1.0
    assert gloss < 0.05
    assert bleu.corpus_bleu(src, ref) < 0.01
