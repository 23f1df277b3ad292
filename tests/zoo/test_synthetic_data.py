"""The registry sweep's synthetic data (``tests/zoo/synthetic_data.py``) has the layout the
zoo's data processors read. Runs without the zoo: each check reads the files back the way
the processor does (csv, h5py, torch.load) and compares with what was asked for."""

import ast
import csv
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from tests import paths

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(paths.REPO) / "tools"))
import synthetic_data as sd
import zoo_sweep


def test_t5_target_length_is_the_shipped_pairing():
    # Model Zoo t5_3B.yaml pairs src_max_sequence_length 512 with tgt_max_sequence_length 114.
    assert zoo_sweep._t5_target_length(512) == 114


def test_bert_pretraining_rows_fit_the_sequence_and_the_vocabulary(tmp_path):
    vocab_file, size = sd.write_vocab(tmp_path / "vocab.txt", sd.BERT_SPECIALS)
    vocab = Path(vocab_file).read_text().split("\n")[:-1]
    assert size == len(vocab) == len(set(vocab)) and vocab[:2] == ["[PAD]", "[UNK]"]
    folder = Path(sd.write_bert_pretraining_csv(tmp_path / "csv", msl=32, examples=6))
    name, count = (folder / "meta.dat").read_text().split()
    with open(folder / name, newline="") as f:
        rows = list(csv.DictReader(f))
    assert int(count) == len(rows) == 6
    for row in rows:
        tokens = ast.literal_eval(row["tokens"])
        segments = ast.literal_eval(row["segment_ids"])
        assert len(tokens) == len(segments) <= 32
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
        assert set(tokens) <= set(vocab) and row["is_random_next"] in ("0", "1")


def test_dpr_groups_match_their_feature_names(tmp_path):
    folder = Path(sd.write_dpr_hdf5(tmp_path, vocab=50, seq=16, contexts=2, examples=4))
    names = json.loads((folder / "data_params.json").read_text())
    with h5py.File(folder / "data-0.h5") as f:
        assert f.attrs["n_examples"] == 4
        assert f["data_0"].shape == (4, len(names["data_0_features"]), 16)
        assert f["data_1"].shape == (4, len(names["data_1_features"]), 2, 16)
        ids, mask = f["data_1"][:, 0], f["data_1"][:, 1]
    assert ids.max() < 50 and not ids[mask == 0].any()  # padding carries no token


def test_multimodal_samples_put_the_image_where_the_text_leaves_room(tmp_path):
    pytest.importorskip("PIL")
    folder = Path(
        sd.write_multimodal_simple_hdf5(
            tmp_path / "h5", tmp_path / "img", vocab=40, seq=12, image_tokens=4, examples=3
        )
    )
    with h5py.File(folder / "data-0.h5") as f:
        data, where = f["data"][:], f["img_data_loc"][:]
        paths = f["img_path"][:]
    assert data.shape == (3, 5, 12) and where.shape == (3, 1, 4)
    np.testing.assert_array_equal(where[0, 0], [1, 2, 3, 4])
    assert not data[:, 1, 1:5].any()  # no loss on image positions
    assert (data[:, 4, 1:5] == 1).all() and data[:, 4].sum() == 3 * 4  # modality marks them
    assert all((tmp_path / "img" / p[0].decode()).is_file() for p in paths)


def test_imagenet_folder_has_the_meta_file_torchvision_reads(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    root = Path(sd.write_imagenet_folder(tmp_path, classes=3, per_class=2, size=(20, 24)))
    wnid_to_classes, val_wnids = torch.load(root / "meta.bin", weights_only=True)
    folders = sorted(p.name for p in (root / "train").iterdir())
    assert sorted(wnid_to_classes) == folders and len(folders) == 3 and val_wnids == []
    with Image.open(next((root / "train" / folders[0]).iterdir())) as image:
        assert image.mode == "RGB" and 20 <= image.size[0] <= 28 and 24 <= image.size[1] <= 32
