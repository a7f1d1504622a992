"""The pure pieces: kernel families, forwards grouping, steady state, ratios, layer counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.config import default_section
from servelab.errors import ServelabError
from servelab.experiment import ProfileSection
from servelab.profile.forwards import (
    ForwardGrouper,
    Launch,
    choose_dim,
    find_steady,
    layers_from_config,
    ratios,
)
from servelab.profile.kernels import (
    classify,
    default_families,
    kernel_family,
    main_attention,
    parse_family_args,
)

BAND = default_section(ProfileSection, "profile").band  # 0.1


@pytest.mark.parametrize(
    ("name", "family"),
    [
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4>(P)",
            "gemm",
        ),
        ("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTT", "gemm"),
        (
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>>(Params)",
            "attention",
        ),
        ("void vllm::paged_attention_v2_kernel<bf16, 128, 16>(...)", "attention"),
        ("kernel_unified_attention_2d", "attention"),
        ("triton_poi_fused_mul_silu_0", "triton"),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096>)",
            "communication",
        ),
        ("void vllm::cross_device_reduce_1stage<bf16, 2>(...)", "communication"),
        ("_C::onednn_mm", "gemm"),
        ("_C::cpu_attention_with_kv_cache", "attention"),
        ("void vllm::rms_norm_kernel<bf16>(...)", "other"),
    ],
)
def test_default_families(name: str, family: str) -> None:
    assert classify(name, default_families()) == family


FA2_TRAITS = "Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, " \
    "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t>>"  # fmt: skip


@pytest.mark.parametrize(
    ("full", "short", "family"),
    [
        # FlashAttention-2 (flash_api.cpp): one short name per kernel, whatever the flags
        (f"void flash::flash_fwd_kernel<{FA2_TRAITS}, false, true, false, false, true, true, "
         "false, false>(Flash_fwd_params)", "flash_fwd_kernel", "flash_fwd_kernel"),
        (f"void flash::flash_fwd_splitkv_kernel<{FA2_TRAITS}, true, false, false, false, true, "
         "false, true, false>(Flash_fwd_params)", "flash_fwd_splitkv_kernel",
         "flash_fwd_splitkv_kernel"),
        ("void flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, "
         "false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, "
         "cutlass::bfloat16_t>>, 4, 2, true>(Flash_fwd_params)",
         "flash_fwd_splitkv_combine_kernel", "flash_fwd_splitkv_combine_kernel"),
        # a torch trace has no short name: cut from the demangled one
        (f"void flash::flash_fwd_splitkv_kernel<{FA2_TRAITS}, false, false, false, false, true, "
         "false, false, false>(Flash_fwd_params)", None, "flash_fwd_splitkv_kernel"),
        # FlashAttention-3: cutlass's generic wrapper, an architecture guard, then the kernel
        ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
         "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>, "
         "cute::tuple<cute::C<128>, cute::C<176>, cute::C<128>>, 128, cutlass::bfloat16_t, "
         "float, cutlass::arch::Sm90, false, false, false, true, true, false, true, false>, "
         "flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>>, cute::tuple<cute::C<1>>, 128, "
         "cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, true, false, false>, "
         "flash::VarlenDynamicPersistentTileScheduler<128, 176, 256, 128, false, true, true, "
         "true, true>>>>(T1::Params)", "device_kernel", "FlashAttnFwdSm90"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4>(P)",
         "Kernel2", "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4"),
        ("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTT", "nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTT",
         "nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTT"),
    ],
)  # fmt: skip
def test_kernel_family(full: str, short: str | None, family: str) -> None:
    assert kernel_family(full, short) == family


def test_main_attention_is_a_family() -> None:
    """Decode-only and mixed forwards run two instantiations: both are the main attention
    kernel (the family with the most time), whichever of them has more time alone."""
    causal = f"void flash::flash_fwd_splitkv_kernel<{FA2_TRAITS}, true>(Flash_fwd_params)"
    plain = f"void flash::flash_fwd_splitkv_kernel<{FA2_TRAITS}, false>(Flash_fwd_params)"
    gemm = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4>(P)"
    other = "void vllm::paged_attention_v2_kernel<bf16, 128, 16>(...)"
    totals = {causal: 40, plain: 35, gemm: 500, other: 60}
    family_of = {n: kernel_family(n) for n in totals}
    fams = default_families()
    assert main_attention(totals, fams, None, None, family_of) == {causal, plain}
    assert main_attention(totals, fams, None) == {other}  # by one name: a kernel is dropped


def test_custom_families_in_order() -> None:
    fams = parse_family_args(["norm=rms_?norm", "gemm=gemm"])
    assert classify("void vllm::rms_norm_kernel<bf16>", fams) == "norm"
    assert classify("flash_fwd_kernel", fams) == "other"
    with pytest.raises(ServelabError, match="write NAME=REGEX"):
        parse_family_args(["gemm"])
    with pytest.raises(ServelabError, match="bad regex"):
        parse_family_args(["x=("])
    with pytest.raises(ServelabError, match="reserved"):
        parse_family_args(["other=x"])


def test_steady_state() -> None:
    # fill 1, 3, 5, 7; steady 8; drain. 8 > 1.1 x 7: the 7s are outside a 10 % band, and
    # inside a 20 % one
    pops = [1, 3, 5, 7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7, 5, 3, 1]
    assert BAND == 0.1
    assert find_steady(pops, BAND) == (4, 13)
    assert find_steady(pops, band=0.2) == (3, 14)
    assert find_steady(pops, band=0.0) == (4, 13)
    assert find_steady([2, 2, None, 2, 2, 2], BAND) == (3, 5)  # unknown populations break runs
    assert find_steady([None, None], BAND) is None and find_steady([], BAND) is None
    # the fill phase is skipped even when a long low-population run precedes the peak
    assert find_steady([1] * 10 + [4, 4, 4], BAND) == (10, 12)
    # two equal runs: the higher population, then the earlier one
    assert find_steady([4, 4, 2, 2, 4, 4], band=0.0) == (0, 1)


def launches(pops: list[int], layers: int, t: int = 0) -> list[Launch]:
    out = []
    for i, p in enumerate(pops):
        for j in range(layers):
            s = t + i * 1000 + j * 100
            out.append(Launch(s, s + 10 * p, p, p))
    return out


def test_grouper_aligns_a_cut_first_forward() -> None:
    seq = launches([1, 2, 2, 3, 3, 3], 4)[3:]  # the window starts after 3 of 4 layers
    g = ForwardGrouper(4)
    for x in seq:
        g.feed(x)
    g.finish()
    assert g.offset == 1 and g.violations == 0
    assert [f.population for f in g.forwards] == [2, 2, 3, 3, 3]
    assert [f.kernel_ns for f in g.forwards] == [80, 80, 120, 120, 120]


def test_grouper_streams_past_its_prefix() -> None:
    pops = [1] * 10 + [8] * 200 + [4] * 3
    g = ForwardGrouper(3)
    for x in launches(pops, 3)[1:]:  # one launch cut
        g.feed(x)
    g.finish()
    assert g.offset == 2 and len(g.forwards) == len(pops) - 1
    assert g.violations == 0 and g.forwards[-1].population == 4
    with pytest.raises(ServelabError):
        ForwardGrouper(0)


def test_choose_dim() -> None:
    assert choose_dim([{1}, {1, 2, 4, 8}, {32}], [0, 0, 0]) == 1
    assert choose_dim([{1, 2}, {1, 2, 4}, {8}], [0, 0, 0]) == 1
    assert choose_dim([{1, 2}, {1, 2, 4}, {8}], [0, 3, 0]) == 0
    assert choose_dim([{1}, {2}, {3}], [0, 0, 0]) is None


def test_ratios() -> None:
    steady = {
        "a": {"population_mean": 1.0, "kernel_us_mean": 5.0},
        "b": {"population_mean": 8.0, "kernel_us_mean": 20.0},
        "c": None,
    }
    # each row's attention paths are the trace analysis's to add (profile.json `ratios`)
    assert ratios(["a", "b", "c"], steady) == [
        {"from": "a", "to": "b", "population_ratio": 8.0, "duration_ratio": 4.0, "paths": []},
        {"from": "b", "to": "c", "population_ratio": None, "duration_ratio": None, "paths": []},
    ]


def test_layers_from_config(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"text_config": {"num_hidden_layers": 36}}))
    assert layers_from_config(p) == 36
    p.write_text(json.dumps({"n_layer": 12}))
    assert layers_from_config(p) == 12
    p.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ServelabError, match="pass --layers N"):
        layers_from_config(p)


@pytest.mark.parametrize("layers", [1, 3, 7])
def test_feed_columns_groups_as_feed_does(layers: int) -> None:
    import random

    from servelab.profile.forwards import PREFIX_FORWARDS, ForwardGrouper, Launch

    rnd = random.Random(layers)
    launches = []
    t = 0
    pop = 4
    for i in range(layers * (PREFIX_FORWARDS + 40) + 5):
        if rnd.random() < 0.05:
            pop = rnd.randrange(1, 9)  # populations change mid-forward now and then
        grid = (2, pop, 4 if i % 89 else 5)  # now and then a layer takes another path
        origin = (42, i)  # (globalPid, correlationId) of the launch call
        launches.append(
            Launch(t, t + rnd.randrange(1, 50), pop, pop if i % 97 else -1, grid, origin)
        )
        t += rnd.randrange(0, 60)
    one = ForwardGrouper(layers)
    for x in launches[3:]:  # a window that begins mid-forward
        one.feed(x)
    many = ForwardGrouper(layers)
    i = 3
    while i < len(launches):
        part = launches[i : i + rnd.choice([1, 2, layers, 5 * layers + 1, 300])]
        starts, ends, pops, tags, keys, origins = zip(*part, strict=True)
        many.feed_columns(starts, ends, pops, tags, list(zip(*keys, strict=True)), origins)
        i += len(part)
    one.finish()
    many.finish()
    assert one.forwards and (layers == 1 or not all(f.consistent for f in one.forwards))
    assert (many.offset, many.launches, many.violations) == (
        one.offset,
        one.launches,
        one.violations,
    )
    assert many.forwards == one.forwards
    # a forward's origin is its first launch's
    assert all(launches[f.origin[1]].start_ns == f.start_ns for f in one.forwards)  # type: ignore[index]
    keys = {f.key for f in one.forwards}
    # forwards whose layers take different paths have no key
    assert (2, 4, 4) in keys and (layers == 1 or None in keys)
