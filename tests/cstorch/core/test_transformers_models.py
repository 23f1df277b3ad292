"""Real Hugging Face models (tiny configs, random init, no downloads) train through cstorch:
three AdamW steps match the same model trained eagerly in torch (issue 3)."""

import copy

import pytest
import torch

import cerebras.pytorch as cstorch
from tests import eager_reference as ref
from tests.jit_cache import xla_compilations

pytestmark = pytest.mark.slow  # compiles whole transformers models

transformers = pytest.importorskip("transformers")

VOCAB = 97


def _gpt2():
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=VOCAB,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    ids = torch.randint(0, VOCAB, (2, 16))
    return transformers.GPT2LMHeadModel(config), dict(input_ids=ids, labels=ids)


def _bert():
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ids = torch.randint(0, VOCAB, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0  # padding: the attention mask path
    return transformers.BertForMaskedLM(config), dict(
        input_ids=ids, attention_mask=mask, labels=ids
    )


def _t5():
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        dropout_rate=0.0,
        decoder_start_token_id=0,
    )
    return transformers.T5ForConditionalGeneration(config), dict(
        input_ids=torch.randint(0, VOCAB, (2, 12)), labels=torch.randint(0, VOCAB, (2, 8))
    )


def _llama():
    # RMSNorm, rotary embeddings, SiLU-gated MLP and grouped-query attention (4 q, 2 kv heads).
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    ids = torch.randint(0, VOCAB, (2, 16))
    return transformers.LlamaForCausalLM(config), dict(input_ids=ids, labels=ids)


def _vit():
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.ViTForImageClassification(config), dict(
        pixel_values=torch.randn(2, 3, 16, 16), labels=torch.randint(0, 10, (2,))
    )


@pytest.mark.parametrize(
    "make", [_gpt2, _bert, _t5, _llama, _vit], ids=["gpt2", "bert", "t5", "llama", "vit"]
)
def test_three_adamw_steps_match_eager_torch(make):
    model, batch = make()
    model.train()
    eager_model = copy.deepcopy(model)

    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    @cstorch.trace
    def training_step(batch):
        loss = compiled(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    losses = [training_step(batch).item() for _ in range(3)]

    eager_optimizer = ref.EagerCstorchAdamW(eager_model.parameters(), weight_decay=0.01)
    expected = []
    for _ in range(3):
        loss = eager_model(**batch).loss
        eager_optimizer.zero_grad()
        loss.backward()
        eager_optimizer.step(1e-3)
        expected.append(loss.item())

    assert training_step.trace_count == 1 and xla_compilations(training_step) == 1
    for step, (a, b) in enumerate(zip(losses, expected)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: cstorch {a} vs eager {b}"
    assert expected[-1] < expected[0]
