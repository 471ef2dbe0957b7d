"""The shipped experiment configs (cfg/*.cfg): each parses and validates, names files where a Kaldi
experiment keeps them, reads with data_io, and builds a model that runs.

MINI cfgs are read with ``$MINI_TIMIT`` pointing at the session's tiny built-in corpus. TIMIT, WSJ and
AMI cfgs are read with their variables pointing at a view of the same corpus named as the Kaldi recipes
name their outputs (``data-fmllr-tri3/train``, ``exp/tri3_ali``, ``exp/tri3/graph``, ... as symbolic
links), so the paths they build are checked against the layout that cfg/README.md documents.
"""

import os
import re
from pathlib import Path

import pytest
import torch

from bru_kaldi import config
from bru_kaldi.chain.den_graph import read_den_fst, write_den_fst
from bru_kaldi.chain.supervision import estimate_denominator
from bru_kaldi.config import ConfigError, parse_config
from data_io import Corpus, LoaderOptions, dataset_for
from bru_kaldi.feature_transforms import parse_fea_opts
from bru_kaldi.kaldi.transition_model import read_transition_model
from bru_kaldi.network import build_model
from models.acoustic import AcousticModel

ROOT = Path(__file__).resolve().parents[1]
CFG_DIR = ROOT / "cfg"
CFGS = sorted(CFG_DIR.glob("**/*.cfg"))  # and cfg/lfmmi_ablation/, the ablation of RESULTS.md
MINI = [p for p in CFGS if p.name.startswith("MINI_")]
MINIW = [p for p in CFGS if p.name.startswith("MINIW_")]  # the word task of the built-in corpus
FBANK_DIM = 40  # the built-in corpus's features (and the 40-dim fMLLR of the Kaldi recipes)
SCORING = {"MINI": "timit", "MINIW": "wsj", "TIMIT": "timit", "WSJ": "wsj", "AMI": "ami"}

# Kaldi recipe name -> the tiny corpus's equivalent, per variable (cfg/README.md lists the Kaldi steps).
SPLITS = ("train", "dev", "test")
KALDI_VIEW = {
    "TIMIT_FMLLR": dict(zip(("train", "dev", "test"), (f"data/{s}" for s in SPLITS))),
    "TIMIT_EXP": {"tri3_ali": "exp/mono_ali_train", "tri3_ali_dev": "exp/mono_ali_dev",
                  "tri3_ali_test": "exp/mono_ali_test", "tri3/graph": "exp/mono/graph",
                  "chain/tree_ali": "exp/chain_ali_train", "chain/tree_ali_dev": "exp/chain_ali_dev",
                  "chain/tree_ali_test": "exp/chain_ali_test", "chain/tree/graph": "exp/chain/graph"},
    "WSJ_FMLLR": dict(zip(("train_si284", "test_dev93", "test_eval92"), (f"data/{s}" for s in SPLITS))),
    "WSJ_EXP": {"tri4b_ali_si284": "exp/mono_ali_train", "tri4b_ali_dev93": "exp/mono_ali_dev",
                "tri4b_ali_eval92": "exp/mono_ali_test", "tri4b/graph_tgpr": "exp/mono/graph",
                "chain/tree_ali_si284": "exp/chain_ali_train", "chain/tree_ali_dev93": "exp/chain_ali_dev",
                "chain/tree_ali_eval92": "exp/chain_ali_test", "chain/tree/graph_tgpr": "exp/chain/graph"},
    "AMI_FMLLR": dict(zip(("train", "dev", "eval"), (f"data/{s}" for s in SPLITS))),
    "AMI_EXP": {"tri3_ali": "exp/mono_ali_train", "tri3_ali_dev": "exp/mono_ali_dev",
                "tri3_ali_eval": "exp/mono_ali_test", "tri3/graph_ami_fsh.o3g.kn.pr1-7": "exp/mono/graph"},
}
DEFAULTED = ("WSJ_GRAPH", "AMI_GMM", "AMI_LM")  # optional variables: the cfgs' defaults are checked
# the den.fst a Kaldi user makes with chain-make-den-fst for the LF-MMI configs (cfg/README.md): ours of the
# tiny corpus's chain alignments stands in for it
DEN_FSTS = {"TIMIT_EXP": "chain/den.fst", "WSJ_EXP": "chain/den.fst"}


@pytest.fixture(scope="module")
def kaldi_view(tiny_corpus, tmp_path_factory) -> dict[str, Path]:
    """``{variable: folder}``: symbolic links with Kaldi's names into the tiny corpus."""
    top = tmp_path_factory.mktemp("kaldi_view")
    folders = {}
    for variable, links in KALDI_VIEW.items():
        folder = top / variable
        for name, target in links.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).symlink_to(tiny_corpus.root / target, target_is_directory=True)
        folders[variable] = folder
    graph = estimate_denominator(tiny_corpus.chain_ali("train"), order=2)
    for variable, name in DEN_FSTS.items():
        (folders[variable] / name).parent.mkdir(parents=True, exist_ok=True)
        write_den_fst(graph, folders[variable] / name)
    return folders


@pytest.fixture(autouse=True)
def environment(monkeypatch, request, tiny_corpus, kaldi_view):
    path = getattr(request.node, "callspec", None) and request.node.callspec.params.get("path")
    if path in MINIW:  # the word task's cfgs: the tiny corpus with its word task
        monkeypatch.setenv("MINI_TIMIT", str(request.getfixturevalue("tiny_words").root))
    else:
        monkeypatch.setenv("MINI_TIMIT", str(tiny_corpus.root))
    for variable, folder in kaldi_view.items():
        monkeypatch.setenv(variable, str(folder))
    for variable in DEFAULTED:
        monkeypatch.delenv(variable, raising=False)


def corpus_of(path: Path) -> str:
    return path.stem.split("_")[0]


def input_dim(cfg: config.Config) -> int:
    streams = {s.fea_name: s for d in cfg.datasets for s in d.fea}
    return sum(FBANK_DIM * (1 + streams[n].cw_left + streams[n].cw_right) for n in cfg.model.inputs)


def build(cfg: config.Config, num_pdfs: int = 119) -> AcousticModel:
    """The acoustic model of ``[model] stack``, as run_exp builds it."""
    return build_model(cfg, input_dim(cfg), num_pdfs, 40 if cfg.model.mono_lab != "none" else None)[0]


def _file(spec: str) -> Path:
    """A Kaldi rspecifier's file (``scp:x`` / ``ark:x`` -> ``x``)."""
    return Path(spec.split(":", 1)[1] if re.match(r"^(scp|ark)(,[a-z]+)*:", spec) else spec)


def test_the_shipped_set_is_there():
    names = {p.stem for p in CFGS}
    assert {"MINI_liBRU", "TIMIT_liBRU", "TIMIT_UBRU", "TIMIT_LBRU", "TIMIT_liGRU", "TIMIT_GRU", "TIMIT_LSTM",
            "TIMIT_liGRU_UBRU", "WSJ_liBRU", "WSJ_liGRU", "AMI_liBRU", "AMI_liGRU"} <= names
    assert {corpus_of(p) for p in CFGS} == set(SCORING)


@pytest.mark.parametrize("path", CFGS, ids=lambda p: p.stem)
def test_cfg_parses_and_validates(path):
    cfg = parse_config(path)
    assert cfg.exp.out_folder == f"exp/{path.stem}"
    assert path.parent == CFG_DIR or path.stem.startswith("MINIW_liGRU_lfmmi_")  # cfg/lfmmi_ablation/
    assert cfg.decoding.scoring == SCORING[corpus_of(path)]
    assert cfg.decoding.decoder == "auto" and len(cfg.decoding.acwt_sweep) >= 4
    use = cfg.data_use
    assert use.valid_with in use.forward_with  # the validation set tunes the scale applied to the others
    if path in MINI + MINIW:  # the core of dev validates each epoch and tunes; dev and test are scored whole
        assert (use.valid_with, use.forward_with) == ("dev_core", ["dev_core", "dev", "test"])
    else:
        assert len(use.forward_with) == 2
    if path in MINI + MINIW:
        assert (cfg.exp.builtin_corpus, cfg.exp.builtin_corpus_dir) == ("default", os.environ["MINI_TIMIT"])
        assert cfg.exp.builtin_corpus_task == ("words" if path in MINIW else "phones")
        assert cfg.exp.n_epochs_tr <= 10
    else:
        assert cfg.exp.builtin_corpus == "none" and cfg.exp.n_epochs_tr == 24  # as the papers
        assert all(d == 0.2 for a in cfg.architectures for d in a.dropout)


@pytest.mark.parametrize("path", CFGS, ids=lambda p: p.stem)
def test_cfg_names_existing_kaldi_files(path):
    cfg = parse_config(path)
    for dataset in cfg.datasets:
        for stream in dataset.fea:
            feats = Path(stream.fea_lst)
            assert feats.is_file(), feats
            options = parse_fea_opts(stream.fea_opts)
            assert options.cmvn == "speaker"
            assert _file(options.utt2spk).is_file() if options.utt2spk else (feats.parent / "utt2spk").is_file()
            if options.cmvn_stats:
                assert _file(options.cmvn_stats).is_file()
        for lab in dataset.lab:
            assert (Path(lab.lab_folder) / "final.mdl").is_file() and (Path(lab.lab_folder) / "ali.1.gz").is_file()
            if lab.lab_name == cfg.model.senone_lab:  # what decoding reads
                assert (Path(lab.lab_data_folder) / "text").is_file()
                assert (Path(lab.lab_graph) / "HCLG.fst").is_file() and (Path(lab.lab_graph) / "words.txt").is_file()


@pytest.mark.parametrize("path", CFGS, ids=lambda p: p.stem)
def test_cfg_data_reads_with_its_labels(path):
    """The validation set through data_io, with every label stream the model trains on."""
    cfg = parse_config(path)
    spec = dataset_for(cfg, cfg.data_use.valid_with, with_labels=True)
    assert [s.fea_name for s in spec.fea] == cfg.model.inputs
    wanted = {cfg.model.senone_lab, cfg.model.mono_lab}
    assert {s.lab_name for s in spec.lab} == wanted - {"none"}
    corpus = Corpus(spec, LoaderOptions(batch_size=2, shuffle=False, prefetch=False))
    assert corpus.feature_dim == input_dim(cfg)
    batch = next(iter(corpus.batches()))
    assert batch.x.shape[-1] == input_dim(cfg)
    assert set(batch.labels) == wanted - {"none"}


@pytest.mark.parametrize("path", CFGS, ids=lambda p: p.stem)
def test_cfg_model_builds_and_runs(path):
    cfg = parse_config(path)
    torch.manual_seed(0)
    model = build(cfg)
    x, lengths = torch.randn(2, 7, input_dim(cfg)), torch.tensor([7, 4])
    frames = -(-7 // cfg.model.frame_subsampling_factor)  # a chain model's output: every third frame
    for training in (True, False):
        model.train(training)
        out = model(x, lengths)
        assert out["senone"].shape == (2, frames, 119)
        assert bool(torch.isfinite(out["senone"]).all())
        assert ("mono" in out) == (cfg.model.mono_lab != "none")


def test_mini_cfgs_cover_every_unit_type_compared():
    """Li-BRU, UBRU with and without backward, LBRU, Li-GRU, GRU, LSTM, bidirectional GRU and
    Li-GRU, and Li-GRU + one UBRU layer on top (forward-backward paper, Table 2)."""
    layers = set()  # (unit, backward, bidirectional) of every architecture of a single-architecture cfg
    stacked = []
    for path in MINI:
        cfg = parse_config(path)
        archs = [cfg.architecture(name) for name in cfg.model.stack]
        if len(archs) == 1:
            layers |= {(archs[0].unit, archs[0].unit_options.get("backward", "none"), all(archs[0].bidirectional))}
        else:
            stacked.append(archs)
    units = {unit for unit, _, _ in layers}
    assert {"libru", "ubru", "lbru", "ligru", "gru", "lstm"} <= units
    assert ("ubru", "none", False) in layers
    assert layers & {("ubru", "kalman", False), ("ubru", "hmm", False)}
    assert ("gru", "none", True) in layers and ("ligru", "none", True) in layers
    assert any(
        [a.unit for a in archs] == ["ligru", "ubru"] and all(archs[0].bidirectional)
        and archs[1].sizes == archs[0].sizes[-1:] and archs[1].bidirectional == [False]
        and archs[1].unit_options.get("backward", "none") != "none"
        for archs in stacked
    ), "no MINI cfg stacks one unidirectional UBRU layer with a backward recursion on bidirectional Li-GRUs"


def test_default_mini_cfg_uses_the_corpus_in_the_repository(monkeypatch):
    monkeypatch.delenv("MINI_TIMIT")
    cfg = parse_config(CFG_DIR / "MINI_liBRU.cfg")
    assert cfg.exp.builtin_corpus_dir == "recipes/mini_timit"
    assert cfg.datasets[0].fea[0].fea_lst == "recipes/mini_timit/data/train/feats.scp"
    assert cfg.datasets[0].lab[0].lab_graph == "recipes/mini_timit/exp/mono/graph"


@pytest.mark.parametrize("path", ["MINI_liBRU.cfg", "MINIW_liGRU_lfmmi.cfg"])
def test_the_tiny_size_reads_every_corpus_path_from_its_own_folder(path, monkeypatch, tmp_path):
    """``--exp,builtin_corpus=tiny`` moves the corpus and every path into it to ``recipes/mini_timit/tiny``,
    so that trying the tiny size never rebuilds the default corpus; the resolved config reads back as it is."""
    monkeypatch.delenv("MINI_TIMIT")
    resolved, again = tmp_path / "resolved.cfg", tmp_path / "again.cfg"
    config.write_resolved(parse_config(CFG_DIR / path, ["--exp,builtin_corpus=tiny"]), resolved)
    text = resolved.read_text()
    corpus_paths = re.findall(r"recipes/mini_timit\S*", text)
    assert len(corpus_paths) > 10, text
    assert all(p.startswith("recipes/mini_timit/tiny") for p in corpus_paths), corpus_paths
    config.write_resolved(parse_config(resolved), again)
    body = lambda written: written.split("\n", 1)[1]  # after the "resolved from" line
    assert body(again.read_text()) == body(text)  # not moved a second time


@pytest.mark.parametrize("path", [p for p in CFGS if "objective = lfmmi" in p.read_text()], ids=lambda p: p.stem)
def test_lfmmi_cfgs_decode_as_kaldi_chain_models(path):
    """Every LF-MMI config decodes on a chain graph (transition and self-loop scale 1.0, as its denominator), at
    acoustic scale 1.0 with lattices scaled by 10, as Kaldi's chain models; the shipped ones train a chain model
    (the chain topology, at a third of the frame rate) and estimate their denominator from its alignments (the
    built-in corpus's monophones) or read a den.fst that exists (a Kaldi recipe's chain tree)."""
    cfg = parse_config(path)
    labs = [lab for d in cfg.datasets for lab in d.lab if lab.lab_name == cfg.model.senone_lab]
    assert labs and all("chain" in lab.lab_graph for lab in labs), [lab.lab_graph for lab in labs]
    assert (cfg.decoding.acwt, cfg.decoding.post_decode_acwt) == (1.0, 10.0) and 1.0 in cfg.decoding.acwt_sweep
    assert cfg.model.lfmmi_den_fst == "" if path in MINI + MINIW else read_den_fst(cfg.model.lfmmi_den_fst).num_states
    if path.parent == CFG_DIR:  # (the ablation's configs undo the fixes one by one)
        assert cfg.model.frame_subsampling_factor == 3 and cfg.model.frame_subsampling == "output"
        chain_topology = read_transition_model(Path(labs[0].lab_folder) / "final.mdl")
        assert not chain_topology.topology.is_hmm  # a forward and a self-loop pdf: the chain topology
        assert (cfg.model.lfmmi_transition_scale, cfg.model.lfmmi_initial_probs) == (1.0, "kaldi")


@pytest.mark.parametrize("name, variable", [("TIMIT_liBRU", "TIMIT_EXP"), ("TIMIT_liBRU", "TIMIT_FMLLR"),
                                            ("WSJ_liBRU", "WSJ_FMLLR"), ("AMI_liGRU", "AMI_EXP")])
def test_unset_variable_is_an_error_naming_it(monkeypatch, name, variable):
    monkeypatch.delenv(variable)
    with pytest.raises(ConfigError, match=rf"environment variable \${variable} is not set"):
        parse_config(CFG_DIR / f"{name}.cfg")


def test_readme_lists_every_cfg_and_every_variable():
    readme = (CFG_DIR / "README.md").read_text()
    for path in CFGS:
        assert f"`{path.relative_to(CFG_DIR)}`" in readme, f"cfg/README.md does not list {path.relative_to(CFG_DIR)}"
    variables = {v for p in CFGS for v in re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", p.read_text())}
    assert variables == {"MINI_TIMIT", *KALDI_VIEW, *DEFAULTED}
    for variable in variables:
        assert f"`{variable}`" in readme or f"`${variable}`" in readme, f"cfg/README.md does not document ${variable}"
