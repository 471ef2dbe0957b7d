"""pytorch-kaldi's last two model-level forms, paraphrased on the tests' tiny corpus:

* an autoencoder (its TIMIT_MLP_fbank_autoencoder): ``enc_out=compute(enc,fbank)``, ``dec_out=compute(dec,enc_out)``,
  ``loss_final=mse(dec_out,fbank)``, ``err_final=cost_err(dec_out,lab_cd)``, ``forward_out=enc_out``: no senone
  output; the mse alone trains; forward writes the code (``utils.forward_model`` stops at ``forward_out``);
  no decoding (its ``require_decoding = False``: nothing to decode);
* per-epoch dropout rates, one progressive value per layer (its TIMIT_MLP_mfcc_basic_flex: ``dnn_drop =
  0.15*12|0.20*12,0.15,...``, expanded per epoch by ``utils.expand_str_ep`` and written into each epoch's
  chunk config): our ``[architectureN] dropout_schedule``.
"""

import re

import numpy as np
import pytest
import torch

from bru_kaldi.config import parse_config
from bru_kaldi.network import build_model, set_epoch_dropout
from bru_kaldi.schedules import dropout_schedule
from tests.test_pytorch_kaldi_cfg import arch, config, env, write  # noqa: F401 (env: a fixture)
from tests.test_run_exp import run

AUTOENCODER = ("\n[model]\nmodel_proto = proto/model.proto\nmodel = enc_out=compute(MLP_encoder,fbank)\n"
               "\tdec_out=compute(MLP_decoder,enc_out)\n\tloss_final=mse(dec_out,fbank)\n"
               "\terr_final=cost_err(dec_out,lab_cd)\n")
# the tests' fbank stream has 40 values per frame (cw 0): the decoder gives them back
AE_ARCHS = (arch(1, "MLP_encoder", "MLP", "dnn", "16,6", "0.15,0.15", "True,True", "False", "relu,linear", "0.08",
                 "False", opt="sgd")
            + arch(2, "MLP_decoder", "MLP", "dnn", "16,40", "0.15,0.0", "True,False", "False", "relu,linear", "0.08",
                   "False", opt="sgd"))


def autoencoder(tmp_path):
    text = config(AE_ARCHS, AUTOENCODER, out="enc_out", decode="False", batch="64")
    text = text.replace("normalize_posteriors = True", "normalize_posteriors = False")
    return write(tmp_path, "autoencoder", text)


def test_the_autoencoder_converts_to_a_stack_without_a_senone_output(env, tmp_path):
    m = parse_config(autoencoder(tmp_path)).model
    assert m.stack == ["MLP_encoder", "MLP_decoder"] and m.inputs == ["fbank"]
    assert (m.senone_output, m.features_arch, m.senone_lab) == (False, "MLP_encoder", "lab_cd")
    assert (m.mse_arch, m.mse_target, m.mse_weight) == ("MLP_decoder", "fbank", 1.0)
    model, groups = build_model(parse_config(autoencoder(tmp_path)), input_dim=40, num_pdfs=31, num_mono=None, mse_dim=40)
    assert model.senone is None and model.mono is None
    model.eval()
    x, lengths = torch.randn(2, 5, 40), torch.tensor([5, 3])
    out = model(x, lengths)
    assert sorted(out) == ["features", "mse"]
    code = model.stacks[0](x, lengths)
    torch.testing.assert_close(out["features"], code, rtol=0, atol=0)
    torch.testing.assert_close(out["mse"], model.stacks[1](code, lengths), rtol=0, atol=0)
    assert out["features"].shape == (2, 5, 6) and (out["features"] < 0).any(), "linear: the code is not rectified"
    assert [len(g) for g in groups] == [len(list(s.parameters())) for s in model.stacks]


def test_the_autoencoders_loss_and_error_are_pytorch_kaldis_by_hand():
    """loss_final = mean over frames and values of (dec - fbank)^2; err_final = the fraction of frames whose
    argmax over dec's values is not the pdf label (cost_err); padding counts in neither."""
    from bru_kaldi.batching import IGNORE
    from bru_kaldi.config import Model
    from bru_kaldi.training import batch_loss

    dec = torch.tensor([[[1.0, 3.0], [0.5, -1.0], [9.0, 9.0]], [[2.0, 0.0], [7.0, 7.0], [7.0, 7.0]]],
                       dtype=torch.float64, requires_grad=True)
    fbank = torch.tensor([[[0.0, 1.0], [0.5, 1.0], [0.0, 0.0]], [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    labels = {"lab_cd": torch.tensor([[1, 1, IGNORE], [1, IGNORE, IGNORE]])}
    model = Model(senone_lab="lab_cd", senone_output=False, mse_arch="dec", mse_target="fbank")
    loss, (loss_sum, errors, frames) = batch_loss({"mse": dec}, labels, model, global_frames=3, target=fbank)
    # by hand: frame 1 (1 + 4) / 2 = 2.5, frame 2 (0 + 4) / 2 = 2, frame 3 (1 + 1) / 2 = 1: mean 5.5 / 3
    # (frame_squared_error sums in float32, as the toolkit's losses under autocast)
    assert float(loss.detach()) == pytest.approx(5.5 / 3, rel=1e-6) and loss_sum == pytest.approx(5.5, rel=1e-6)
    # argmax 1, 0, 0 against labels 1, 1, 1: two errors of three frames
    assert (errors, frames) == (2, 3)
    loss.backward()
    assert torch.all(dec.grad[0, 2] == 0) and torch.all(dec.grad[1, 1:] == 0), "no gradient from padding"
    # d/d dec of sum (dec - fbank)^2 / (2 values x 3 frames): 2 (dec - fbank) / 6
    want = np.zeros((2, 3, 2))
    want[0, :2] = 2 * (dec.detach().numpy()[0, :2] - fbank.numpy()[0, :2]) / 6
    want[1, :1] = 2 * (dec.detach().numpy()[1, :1] - fbank.numpy()[1, :1]) / 6
    np.testing.assert_allclose(dec.grad.numpy(), want, rtol=1e-6)


def test_the_autoencoder_trains_and_forward_writes_its_code(env, tmp_path):
    import data_io

    path = autoencoder(tmp_path)
    native = run(env, tmp_path / "exp", "--convert", config=path).stdout
    assert "\nsenone_output = False\n" in native and "\nfeatures_arch = MLP_encoder\n" in native
    run(env, tmp_path / "exp", config=path)
    res = (tmp_path / "exp" / "res.res").read_text()
    epochs = [line for line in res.splitlines() if line.startswith("epoch=")]
    assert len(epochs) == 1 and "%WER" not in res, res
    loss = float(re.search(r"train_loss=([\d.]+)", epochs[0]).group(1))
    assert 0 < loss < 10, epochs[0]
    trained = torch.load(tmp_path / "exp" / "final.pt", map_location="cpu", weights_only=True)["model"]
    assert not any(k.startswith("senone.") for k in trained)
    codes = dict(data_io.read_matrices(f"scp:{tmp_path / 'exp' / 'forward_test' / 'loglikes.scp'}"))
    test_lengths = {k: len(v) for k, v in data_io.read_matrices(f"scp:{env.root / 'data' / 'test' / 'feats.scp'}")}
    assert {k: len(v) for k, v in codes.items()} == test_lengths
    assert all(v.shape[1] == 6 for v in codes.values()) and min(v.min() for v in codes.values()) < 0
    assert not (tmp_path / "exp" / "decode_test").exists()


# --------------------------------------------------------------------------- dropout schedules
def test_dropout_schedule_expands_per_layer_and_epoch():
    """pytorch-kaldi's expand_str_ep of each layer's value; epoch 1 and 13 of the flex config's first layers."""
    rates = dropout_schedule("0.15*12|0.20*12,0.15,0.15*10|0.20*14,0.15", 4, 24)
    assert rates[0] == [0.15, 0.15, 0.15, 0.15] and rates[12] == [0.20, 0.15, 0.20, 0.15]
    assert rates[10] == [0.15, 0.15, 0.20, 0.15] and len(rates) == 24
    assert dropout_schedule("0.1*2", 3, 2) == [[0.1] * 3] * 2
    for text, message in (("0.1*2,0.2", "one per layer \\(3\\)"), ("0.1*1", "layer 1: .* 1 epochs' values"),
                          ("1.5*2", "outside \\[0, 1\\)")):
        with pytest.raises(ValueError, match=message):
            dropout_schedule(text, 3, 2)


SCHEDULED = arch(1, "MLP_layers1", "MLP", "dnn", "12,12,N_out_lab_cd", "0.15*1|0.20*1,0.1,0.0", "True,True,False",
                 "False", "relu,relu,softmax", "0.08", "False", opt="sgd")
MLP_MODEL = ("\n[model]\nmodel_proto = proto/model.proto\nmodel = out_dnn1=compute(MLP_layers1,fbank)\n"
             "\tloss_final=cost_nll(out_dnn1,lab_cd)\n\terr_final=cost_err(out_dnn1,lab_cd)\n")


def test_progressive_dropout_translates_and_sets_each_epochs_rates(env, tmp_path):
    cfg = parse_config(write(tmp_path, "flex", config(SCHEDULED, MLP_MODEL, epochs=2, out="out_dnn1", batch="64")))
    a = cfg.architecture("MLP_layers1")
    assert a.dropout_schedule == "0.15*1|0.20*1,0.1" and a.dropout == [0.15, 0.1] and a.dropout_at == "inside"
    model, _ = build_model(cfg, input_dim=40, num_pdfs=31, num_mono=None)
    cells = [layer.cells[0] for layer in model.stacks[0].layers]
    assert [c.inner_dropout for c in cells] == [0.15, 0.1]
    for epoch, want in ((1, [0.2, 0.1]), (0, [0.15, 0.1])):  # either order: a function of the epoch alone
        assert set_epoch_dropout(model, cfg, epoch) == {"MLP_layers1": want}
        assert [c.inner_dropout for c in cells] == want
    with pytest.raises(Exception, match=r"dropout_schedule: .*2 epochs' values, the config trains 3"):
        parse_config(write(tmp_path, "bad", config(SCHEDULED, MLP_MODEL, epochs=3, out="out_dnn1")))


def test_a_dropout_schedule_runs_with_each_epochs_rates(env, tmp_path):
    path = write(tmp_path, "flex", config(SCHEDULED, MLP_MODEL, epochs=2, out="out_dnn1", batch="64"))
    run(env, tmp_path / "exp", "--stop-stage", "train", config=path)
    log = (tmp_path / "exp" / "log.txt").read_text()
    assert "epoch 1: MLP_layers1 dropout rates 0.15,0.1" in log and "epoch 2: MLP_layers1 dropout rates 0.2,0.1" in log
