"""The TransitionModel reader and writer against kaldi-hmm-gmm and against Kaldi's binary format."""

import struct

import numpy as np
import pytest

from tests.kaldi_fixtures import khg_model, random_alignment, random_phones
from bru_kaldi.kaldi.transition_model import (KaldiIOError, TransitionModel, read_transition_model, standard_topology_text,
                              write_transition_model)

KINDS = ["standard", "shared", "chain"]


@pytest.fixture(scope="module", params=KINDS)
def pair(request):
    """(kaldi-hmm-gmm's model, ours parsed from its Kaldi text)."""
    reference = khg_model(request.param)
    return reference, TransitionModel.from_kaldi_text(str(reference))


def test_standard_topology_is_gen_topo_pl():
    text = standard_topology_text([2, 3], [1])
    assert "<State> 0 <PdfClass> 0 <Transition> 0 0.75 <Transition> 1 0.25 </State>" in text
    assert ("<State> 0 <PdfClass> 0 <Transition> 0 0.25 <Transition> 1 0.25 <Transition> 2 0.25 "
            "<Transition> 3 0.25 </State>") in text
    assert "<State> 2 <PdfClass> 2 <Transition> 1 0.25 <Transition> 2 0.25 <Transition> 3 0.25 <Transition> 4 0.25" in text
    assert "<State> 4 <PdfClass> 4 <Transition> 4 0.75 <Transition> 5 0.25 </State>" in text


def test_text_written_byte_for_byte_as_kaldi(pair):
    reference, tm = pair
    assert tm.to_kaldi_text() == str(reference)


@pytest.mark.parametrize("binary", [True, False])
def test_every_transition_id_maps_as_kaldi(pair, binary, tmp_path):
    reference, tm = pair
    path = tmp_path / "final.mdl"
    write_transition_model(reference, path, binary=binary)
    assert path.read_bytes().startswith(b"\0B<TransitionModel> ") == binary
    read = read_transition_model(path)
    assert read.num_transition_ids == reference.num_transition_ids
    assert read.num_pdfs == reference.num_pdfs
    assert read.num_phones == len(reference.topo.phones)
    for tid in range(1, read.num_transition_ids + 1):
        assert read.tid2pdf[tid] == reference.transition_id_to_pdf(tid), tid
        assert read.tid2phone[tid] == reference.transition_id_to_phone(tid), tid
        assert read.tid_is_self_loop[tid] == reference.is_self_loop(tid), tid
        assert read.tid_is_final[tid] == reference.is_final(tid), tid
    assert read.tid2pdf[0] == -1 and read.tid2phone[0] == -1  # index 0 unused, as in Kaldi
    np.testing.assert_allclose(read.log_probs, np.asarray(reference.log_probs), atol=1e-5)
    assert read.to_kaldi_text() == str(reference)


def _kaldi_binary_by_hand() -> bytes:
    """Kaldi's binary TransitionModel for one 2-state phone, assembled from io-funcs' rules directly."""
    def i32(v):  # WriteBasicType<int32>: size byte 4, then the value
        return struct.pack("<bi", 4, v)

    def f32(v):
        return struct.pack("<bf", 4, v)

    def ivec(values):  # WriteIntegerVector: element size, raw int32 count, elements
        return struct.pack("<bi", 4, len(values)) + struct.pack(f"<{len(values)}i", *values)

    topology = (b"<Topology> " + ivec([1]) + ivec([-1, 0]) + i32(1)  # phones, phone2idx, 1 entry
                + i32(3)  # 3 states
                + i32(0) + i32(2) + i32(0) + f32(0.5) + i32(1) + f32(0.5)  # pdf class 0, 2 arcs
                + i32(1) + i32(2) + i32(1) + f32(0.75) + i32(2) + f32(0.25)  # pdf class 1, 2 arcs
                + i32(-1) + i32(0)  # final state: no pdf, no arcs
                + b"</Topology> ")
    log_probs = np.log([1.0, 0.5, 0.5, 0.75, 0.25]).astype("<f4")  # index 0 holds log(1) = 0
    return (b"\0B<TransitionModel> " + topology + b"<Triples> " + i32(2)
            + i32(1) + i32(0) + i32(0) + i32(1) + i32(1) + i32(1) + b"</Triples> "
            + b"<LogProbs> FV " + i32(5) + log_probs.tobytes() + b"</LogProbs> </TransitionModel> ")


def test_binary_format_matches_kaldi_rules():
    data = _kaldi_binary_by_hand()
    tm = TransitionModel.from_bytes(data)
    assert tm.tid2pdf.tolist() == [-1, 0, 0, 1, 1]
    assert tm.tid_is_self_loop.tolist() == [False, True, False, True, False]
    assert tm.tid_is_final.tolist() == [False, False, False, False, True]
    assert tm.to_kaldi_binary() == data


def test_chain_topology_binary_flags_self_loop_pdf_classes():
    tm = TransitionModel.from_kaldi_text(str(khg_model("chain")))
    data = tm.to_kaldi_binary()
    # after phones [1 2 3] and phone2idx [-1 0 0 0]: the -1 flag, then one entry
    flag_at = len(b"\0B<TransitionModel> <Topology> ") + 5 + 3 * 4 + 5 + 4 * 4
    assert data[flag_at:flag_at + 10] == struct.pack("<bibi", 4, -1, 4, 1)
    assert b"<Tuples> " in data and TransitionModel.from_bytes(data).tid2pdf.tolist() == tm.tid2pdf.tolist()


def test_model_file_goes_on_after_the_transition_model(tmp_path):
    tm = TransitionModel.from_kaldi_text(str(khg_model()))
    path = tmp_path / "final.mdl"
    path.write_bytes(tm.to_kaldi_binary() + b"<DIMENSION> \x04\x0d\x00\x00\x00<NUMPDFS> ...")  # a GMM follows
    assert read_transition_model(path).num_pdfs == tm.num_pdfs


@pytest.mark.parametrize("reordered", [False, True])
def test_ali_to_phones_recovers_the_phone_sequence(reordered):
    tm = TransitionModel.from_kaldi_text(str(khg_model()))
    reference = khg_model()
    rng = np.random.default_rng(1)
    for _ in range(30):
        phones = random_phones(rng, int(rng.integers(1, 8)))
        ali = random_alignment(tm, phones, rng, reordered=reordered)
        assert tm.ali_to_phones(ali) == phones
        per_frame = tm.ali_to_phones_per_frame(ali)
        assert per_frame.tolist() == [reference.transition_id_to_phone(int(t)) for t in ali]
        assert tm.ali_to_pdf(ali).tolist() == [reference.transition_id_to_pdf(int(t)) for t in ali]
        assert sum(len(p) for p in tm.split_to_phones(ali)) == len(ali)


def test_hmm_info_counts():
    tm = TransitionModel.from_kaldi_text(str(khg_model()))
    # 4 phones x 3 states + 5 silence states = 17 pdfs; arcs: 4 x 3 x 2 + (4 + 4 * 3 + 2) = 42
    assert tm.info() == {"phones": 5, "pdfs": 17, "transition-ids": 42, "transition-states": 17}
    assert tm.max_phone == 5


def test_errors_name_the_file_and_what_was_expected(tmp_path):
    good = TransitionModel.from_kaldi_text(str(khg_model())).to_kaldi_binary()
    path = tmp_path / "final.mdl"
    path.write_bytes(good[:len(good) // 2])
    with pytest.raises(KaldiIOError, match=r"final\.mdl.*binary.*expected"):
        read_transition_model(path)
    path.write_text("<TransitionModel> <Topology> <TopologyEntry> <Phones> 1 </Phones>")
    with pytest.raises(KaldiIOError, match=r"final\.mdl.*text.*expected <ForPhones>, got '<Phones>'"):
        read_transition_model(path)
    with pytest.raises(KaldiIOError, match="cannot read the model"):
        read_transition_model(tmp_path / "missing.mdl")
    tm = TransitionModel.from_bytes(good)
    with pytest.raises(KaldiIOError, match="transition-id 43 is outside"):
        tm.ali_to_pdf(np.array([1, 43]))
