"""Small synthetic training data in the on-disk formats the Model Zoo's data processors read.

Used by the registry sweep (``tools/zoo_sweep.py``): each writer makes a folder the named
processor accepts as it is (the format is learned from the processor's reading code, the
code here is this project's), with a tiny vocabulary of made-up words instead of a
downloaded tokenizer. Everything is seeded, so a folder is the same on every run.

Every writer returns what the sweep's config needs to point at it (paths, sizes).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

# Made-up lower-case "words": two letters each, never split by a BERT word-piece tokenizer.
WORDS = [a + b for a in "bdfgklmnprst" for b in "aeiou"]  # 60 words


def _folder(path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write_lines(path: Path, lines) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def _meta(folder: Path, entries) -> None:
    """``meta.dat``: one ``<file...> <number of examples>`` line per data file."""
    _write_lines(folder / "meta.dat", (" ".join(map(str, entry)) for entry in entries))


# --- vocabularies ---------------------------------------------------------------------------

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
T5_SPECIALS = ["<pad>", "</s>", "<unk>", "<s>"]


def write_vocab(path, specials) -> tuple[str, int]:
    """A vocabulary file (one token a line): the special tokens, then ``WORDS``."""
    path = Path(path)
    _folder(path.parent)
    tokens = list(specials) + WORDS
    _write_lines(path, tokens)
    return str(path), len(tokens)


# --- BERT family (CSV/TSV) ------------------------------------------------------------------


def write_bert_pretraining_csv(folder, msl: int, examples=16, seed=0) -> str:
    """BertCSVDynamicMaskDataProcessor / BertCSVDataProcessor-style rows: ``tokens`` (a
    Python list literal of word strings with ``[CLS]``/``[SEP]``), ``segment_ids`` and
    ``is_random_next``; masking is done by the processor."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)
    with open(folder / "part-0.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["tokens", "segment_ids", "is_random_next"])
        writer.writeheader()
        for _ in range(examples):
            first = int(rng.integers(4, msl // 2 - 2))
            second = int(rng.integers(4, msl - first - 3))
            words = [WORDS[i] for i in rng.integers(0, len(WORDS), first + second)]
            tokens = ["[CLS]", *words[:first], "[SEP]", *words[first:], "[SEP]"]
            segments = [0] * (first + 2) + [1] * (second + 1)
            writer.writerow(
                {
                    "tokens": repr(tokens),
                    "segment_ids": repr(segments),
                    "is_random_next": int(rng.integers(0, 2)),
                }
            )
    _meta(folder, [("part-0.csv", examples)])
    return str(folder)


def _sentence(rng, low=3, high=12) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(low, high))))


def write_glue_tsv(folder, task: str, examples=16, seed=0) -> str:
    """``train.tsv`` of SST-2 (``sentence``, ``label``) or MNLI (``sentence1``,
    ``sentence2``, ``gold_label``) as the classifier processors read it."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)
    with open(folder / "train.tsv", "w", newline="") as f:
        if task == "sst2":
            fields = ["sentence", "label"]
            rows = (
                {"sentence": _sentence(rng), "label": int(rng.integers(0, 2))}
                for _ in range(examples)
            )
        else:
            fields = ["sentence1", "sentence2", "gold_label"]
            labels = ["entailment", "neutral", "contradiction"]
            rows = (
                {
                    "sentence1": _sentence(rng),
                    "sentence2": _sentence(rng),
                    "gold_label": labels[int(rng.integers(0, 3))],
                }
                for _ in range(examples)
            )
        writer = csv.DictWriter(f, fields, delimiter="\t", quoting=csv.QUOTE_NONE)
        writer.writeheader()
        writer.writerows(rows)
    return str(folder)


def write_bertsum_csv(folder, vocab_size: int, msl: int, max_cls: int, examples=16, seed=0) -> str:
    """BertSumCSVDataProcessor rows, columns in its order: ``input_token_ids``,
    ``labels``, ``segment_ids``, ``cls_indices`` (integer list literals): a document of
    sentences, each opened by a ``[CLS]`` (id 2) and closed by a ``[SEP]`` (id 3)."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)
    with open(folder / "part-0.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["input_token_ids", "labels", "segment_ids", "cls_indices"])
        for _ in range(examples):
            ids, segments, cls_indices, labels = [], [], [], []
            sentence = 0
            while len(cls_indices) < max_cls:
                length = int(rng.integers(3, 8))
                if len(ids) + length + 2 > msl:
                    break
                cls_indices.append(len(ids))
                labels.append(int(rng.integers(0, 2)))
                ids += [2, *rng.integers(len(BERT_SPECIALS), vocab_size, length).tolist(), 3]
                segments += [sentence % 2] * (length + 2)
                sentence += 1
            writer.writerow([repr(ids), repr(labels), repr(segments), repr(cls_indices)])
    _meta(folder, [("part-0.csv", examples)])
    return str(folder)


NER_LABELS = ["O", "B-Chemical", "I-Chemical"]


def write_ner_csv(folder, msl: int, examples=16, seed=0) -> tuple[str, str, int]:
    """BertTokenClassifierDataProcessor rows (``tokens``, ``labels``: space-separated, one
    label a token, ``[CLS]``/``[SEP]`` included) and the ``label2id.json`` it reads.
    Returns the folder, the label file and the number of classes."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)
    label_map = {
        "[PAD]": 0,
        **{name: i + 1 for i, name in enumerate(NER_LABELS)},
        "[CLS]": len(NER_LABELS) + 1,
        "[SEP]": len(NER_LABELS) + 2,
    }
    label_file = folder / "label2id.json"
    label_file.write_text(json.dumps(label_map))
    with open(folder / "part-0.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["tokens", "labels"])
        writer.writeheader()
        for _ in range(examples):
            n = int(rng.integers(4, msl - 2))
            words = [WORDS[i] for i in rng.integers(0, len(WORDS), n)]
            labels = [NER_LABELS[i] for i in rng.integers(0, len(NER_LABELS), n)]
            writer.writerow(
                {
                    "tokens": " ".join(["[CLS]", *words, "[SEP]"]),
                    "labels": " ".join(["[CLS]", *labels, "[SEP]"]),
                }
            )
    _meta(folder, [("part-0.csv", examples)])
    return str(folder), str(label_file), len(label_map)


# --- T5 / Transformer (tokenized text) ------------------------------------------------------


def write_t5_text(folder, examples=32, seed=0) -> str:
    """T5DynamicDataProcessor input: text files of space-separated tokens, one document a
    line, listed in ``meta.dat`` with their line counts (the processor chunks and corrupts
    spans itself)."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)
    _write_lines(folder / "docs-0.txt", (_sentence(rng, 40, 120) for _ in range(examples)))
    _meta(folder, [("docs-0.txt", examples)])
    return str(folder)


def write_translation_text(folder, max_len: int, examples=16, seed=0) -> str:
    """TransformerDynamicDataProcessor input: aligned source/target token files (one
    sentence a line) and a ``meta.dat`` line ``<source path> <target path> <count>``."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)
    src = _write_lines(
        folder / "train.src", (_sentence(rng, 4, max_len - 2) for _ in range(examples))
    )
    tgt = _write_lines(
        folder / "train.tgt", (_sentence(rng, 4, max_len - 2) for _ in range(examples))
    )
    _meta(folder, [(src, tgt, examples)])
    return str(folder)


# --- HDF5 (sample format) -------------------------------------------------------------------


def _h5(path: Path, n_examples: int, **datasets) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            f.create_dataset(name, data=value)
        f.attrs["n_examples"] = n_examples


def _lm_sample(rng, vocab: int, seq: int, n: int, pad_tail=True):
    """Input ids, a loss mask (trailing padding off when ``pad_tail``) and next-token labels."""
    tokens = rng.integers(1, vocab, size=(n, seq + 1), dtype=np.int32)
    mask = np.ones((n, seq), np.int32)
    if pad_tail:
        for row in range(n):
            mask[row, int(rng.integers(seq // 2, seq)) :] = 0
    return tokens[:, :-1], mask, tokens[:, 1:]


def write_gpt_hdf5(folder, vocab: int, seq: int, examples=16, seed=0, per_example=False) -> str:
    """GptHDF5DataProcessor input (Model Zoo 1.7 and later): ``data`` ``[N, 3, seq]`` (input
    ids, attention mask, labels), ``n_examples`` attribute. ``per_example``: the 1.6 layout,
    one ``example_<i>`` dataset ``[3, seq]`` per example."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)
    data = np.stack(_lm_sample(rng, vocab, seq, examples), axis=1)
    if per_example:
        _h5(folder / "data-0.h5", examples, **{f"example_{i}": row for i, row in enumerate(data)})
    else:
        _h5(folder / "data-0.h5", examples, data=data)
    return str(folder)


def write_dpo_hdf5(folder, vocab: int, seq: int, examples=16, seed=0) -> str:
    """DpoHDF5DataProcessor input: ``data`` ``[N, 6, seq]`` (chosen ids, mask, labels,
    rejected ids, mask, labels), ``n_examples`` attribute."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)
    chosen = _lm_sample(rng, vocab, seq, examples)
    rejected = _lm_sample(rng, vocab, seq, examples)
    _h5(folder / "data-0.h5", examples, data=np.stack([*chosen, *rejected], axis=1))
    return str(folder)


def write_dpr_hdf5(folder, vocab: int, seq: int, contexts=2, examples=16, seed=0) -> str:
    """DPRHDF5DataProcessor input: two feature groups named in ``data_params.json``,
    ``data_0`` ``[N, 3, seq]`` (question ids, attention mask, token types) and ``data_1``
    ``[N, 3, contexts, seq]`` (the positive and hard-negative contexts)."""
    folder = _folder(folder)
    rng = np.random.default_rng(seed)

    def encoded(shape):
        ids = rng.integers(len(BERT_SPECIALS), vocab, size=shape, dtype=np.int32)
        mask = np.ones(shape, np.int32)
        lengths = rng.integers(seq // 2, seq + 1, size=shape[:-1])
        mask[np.arange(seq) >= lengths[..., None]] = 0
        ids *= mask
        return np.stack([ids, mask, np.zeros(shape, np.int32)], axis=1)

    _h5(
        folder / "data-0.h5",
        examples,
        data_0=encoded((examples, seq)),
        data_1=encoded((examples, contexts, seq)),
    )
    (folder / "data_params.json").write_text(
        json.dumps(
            {
                "data_0_features": [
                    "questions_input_ids",
                    "questions_attention_mask",
                    "questions_token_type_ids",
                ],
                "data_1_features": ["ctx_input_ids", "ctx_attention_mask", "ctx_token_type_ids"],
            }
        )
    )
    return str(folder)


# --- images ---------------------------------------------------------------------------------


def _png(path: Path, rng, size) -> None:
    from PIL import Image

    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(path)


def write_imagenet_folder(root, classes=2, per_class=8, size=(40, 40), seed=0) -> str:
    """An ImageNet-layout root as torchvision's ``ImageNet`` reads it: ``train/<wnid>/*``
    images (PNG: lossless, so every reader decodes the same pixels) and the ``meta.bin``
    that maps each wnid to its class names (written with ``torch.save``, loadable with
    ``weights_only=True``). ``size`` is (width, height); image sizes vary a little."""
    import torch

    root = _folder(root)
    rng = np.random.default_rng(seed)
    wnids = [f"n{index:08d}" for index in range(classes)]
    for wnid in wnids:
        folder = _folder(root / "train" / wnid)
        for index in range(per_class):
            jitter = rng.integers(0, 9, 2)
            _png(
                folder / f"{wnid}_{index}.png",
                rng,
                (size[0] + int(jitter[0]), size[1] + int(jitter[1])),
            )
    torch.save(({wnid: (f"class {i}",) for i, wnid in enumerate(wnids)}, []), root / "meta.bin")
    return str(root)


def write_latent_folder(root, shape, classes=2, per_class=8, seed=0) -> str:
    """DiffusionLatentImageNet1KProcessor input: ``train/<class>/*.npz``, each with a VAE
    posterior ``vae_output`` of ``shape`` = [2 * latent channels, H, W] (means, then log
    variances) and its ``label``."""
    root = _folder(root)
    rng = np.random.default_rng(seed)
    for label in range(classes):
        folder = _folder(root / "train" / f"n{label:08d}")
        for index in range(per_class):
            latent = rng.standard_normal(shape).astype(np.float32)
            half = shape[0] // 2
            latent[half:] = -4.0 + 0.1 * latent[half:]  # small variances
            np.savez(
                folder / f"{index}.npz", vae_output=latent, label=np.array(label, dtype=np.int64)
            )
    return str(root)


def _image_files(folder: Path, rng, count, size) -> list[bytes]:
    names = []
    for index in range(count):
        name = f"img_{index}.png"
        _png(folder / name, rng, size)
        names.append(name.encode())
    return names


def write_llava_hdf5(
    folder,
    images,
    vocab: int,
    seq: int,
    image_tokens: int,
    image_start=1,
    image_size=(40, 40),
    examples=16,
    seed=0,
) -> str:
    """LlavaHDF5MapDataProcessor input ("sample" format): ``data`` ``[N, 4, seq]`` (text
    ids, loss mask, labels, key padding mask: 1 on padding) and ``img_path`` ``[N, 1]``
    (file names under ``images``); the image's ``image_tokens`` features take the text
    positions from ``image_start`` on, which carry no loss."""
    folder, images = _folder(folder), _folder(images)
    rng = np.random.default_rng(seed)
    ids, loss, labels = _lm_sample(rng, vocab, seq, examples)
    loss[:, image_start : image_start + image_tokens] = 0
    padding = (loss == 0).astype(np.int32)
    padding[:, : image_start + image_tokens] = 0
    names = _image_files(images, rng, examples, image_size)
    _h5(
        folder / "data-0.h5",
        examples,
        data=np.stack([ids, loss, labels, padding], axis=1),
        img_path=np.array([[name] for name in names], dtype="S"),
    )
    return str(folder)


def write_multimodal_simple_hdf5(
    folder,
    images,
    vocab: int,
    seq: int,
    image_tokens: int,
    image_start=1,
    image_size=(40, 40),
    examples=16,
    seed=0,
) -> str:
    """MultimodalSimpleHDF5MapDataProcessor input: ``data`` ``[N, 5, seq]`` (the four of
    LLaVA's, then the token modality: 1 on image positions), ``img_path`` ``[N, 1]`` and
    ``img_data_loc`` ``[N, 1, image_tokens]`` (the text positions of the image's
    features)."""
    folder, images = _folder(folder), _folder(images)
    rng = np.random.default_rng(seed)
    ids, loss, labels = _lm_sample(rng, vocab, seq, examples)
    where = np.arange(image_start, image_start + image_tokens, dtype=np.int32)
    loss[:, where] = 0
    padding = (loss == 0).astype(np.int32)
    padding[:, : image_start + image_tokens] = 0
    modality = np.zeros_like(ids)
    modality[:, where] = 1
    names = _image_files(images, rng, examples, image_size)
    _h5(
        folder / "data-0.h5",
        examples,
        data=np.stack([ids, loss, labels, padding, modality], axis=1),
        img_path=np.array([[name] for name in names], dtype="S"),
        img_data_loc=np.broadcast_to(where, (examples, 1, image_tokens)).copy(),
    )
    return str(folder)
