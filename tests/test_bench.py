"""`bench scale` (sized for a GPU) runs on the CPU at a small size and reports every number
it promises, each from a real measurement."""

import pytest

from explore_rl import bench


@pytest.mark.slow
def test_bench_scale_reports_throughput_mfu_and_memory_per_shape():
    out = bench.main(
        ["scale", "--presets", "tiny-qwen2,tiny-llama", "--dtype", "float32", "--prompts", "2",
         "--group", "2", "--prompt-len", "8", "--new-tokens", "4", "--micro-batches", "2"]
    )  # fmt: skip
    assert out["bench"] == "scale" and out["matmul_peak_tflops"] > 0
    assert [r["preset"] for r in out["results"]] == ["tiny-qwen2", "tiny-llama"]
    for r in out["results"]:
        for key in (
            "sample_tokens_per_s",
            "update_tokens_per_s",
            "update_mfu",
            "peak_memory_gib_so_far",
        ):
            assert r[key] > 0, (r["preset"], key)
        assert 0 < r["sample_fraction_of_peak"] < 1 and 0 < r["update_mfu"] < 1


def test_bench_engine_reports_what_each_slot_count_did():
    """Each slot count as the bench's own process runs it (docs/scaling.md runs the whole
    command, a process per count)."""
    common = ["engine", "--random-init", "tiny-llama", "--prompts", "2", "--group", "4",
              "--new-tokens", "8", "--chunk", "2", "--windows", "0,2", "--only"]  # fmt: skip
    (one, segments), (whole, slotted) = (bench.main([*common, s])["runs"] for s in ("0", "3"))
    assert (one["slots"], segments["slots"], slotted["slots"]) == (0, 0, 3)
    # the one pass's segments and the slots' chunks attend all 8 slots, then 2, 4, 8
    assert [r["window"] for r in (one, segments, whole, slotted)] == [0, 2, 0, 2]
    # the same rows whatever the slots and the window
    assert one["rows"] == segments["rows"] == slotted["rows"] == whole["rows"]
    assert one["useful_tokens"] == slotted["useful_tokens"] > 0
    assert one["refills"] == 0 and slotted["refills"] == 8 - 3
    for r in (one, segments, whole, slotted):
        for key in (
            "useful_tokens_per_s", "occupancy", "prefill_s", "decode_s", "peak_rss_gib",
            "decode_tokens_per_s", "fraction_of_bandwidth_bound", "bandwidth_gbs",
        ):  # fmt: skip
            assert r[key] > 0, (r["slots"], key)
        assert 0 < r["occupancy"] <= 1 and r["kv_cache_bytes"] > 0


def test_bench_lora_times_each_rank_beside_full_fine_tuning(capsys):
    out = bench.main(["lora", "--config", "configs/grpo.py:smoke", "--ranks", "1", "4",
                      "--steps", "1"])  # fmt: skip
    settings = out["settings"]
    assert list(settings) == ["full", "rank 1", "rank 4"]
    assert settings["full"]["step_over_full"] == 1.0
    # what trains, by hand from tiny-llama's shape (d 32, 2 layers, 4 heads and 2 KV heads
    # of 8, d_ff 64, 49152 tied embeddings): the whole model, or the adapters alone, r x
    # (in + out) of q 32+32, k and v 32+16, o 32+32, gate and up 32+64, down 64+32 a layer
    layer = 4 * 8 * 32 * 2 + 2 * 8 * 32 * 2 + 3 * 32 * 64 + 2 * 32
    full = 49152 * 32 + 2 * layer + 32
    per_rank = 2 * (64 + 48 + 48 + 64 + 96 + 96 + 96)
    trains = {"full": full, "rank 1": per_rank, "rank 4": 4 * per_rank}
    for name, s in settings.items():
        assert s["tokens"] > 0 and s["step_s"] > 0, name
        parts = s["rollout_s"] + s["pi_old_s"] + s["update_s"]
        assert abs(parts - s["step_s"]) <= 0.002, name  # the step is its phases, rounded
        assert s["trainable_params"] == trains[name], name
        # Adam's two moments of what trains, and nothing of the frozen base
        assert 2 * trains[name] <= s["optimizer_state"] <= 2 * trains[name] + 8, name
    with pytest.raises(SystemExit):
        bench.main(["lora", "--ranks", "0"])
    assert "ranks >= 1" in capsys.readouterr().err


def test_bench_sample_decodes_random_prompts_against_the_bandwidth_bound(capsys):
    """Q random prompts x B / Q rows of a preset's own shape (no tokenizer read): tokens/s
    and the fraction of the bandwidth bound, for each decode window (the same tokens).
    Bad input: one line."""
    out = bench.main(["sample", "--model", "", "--random-init", "tiny-qwen2", "--prompt-len",
                      "8", "--new-tokens", "6", "--rows", "4", "--prompts", "2", "--no-peer",
                      "--reps", "1", "--windows", "0,2"])  # fmt: skip
    assert (out["rows"], out["prompt_len"], out["new_tokens"], out["window"]) == (4, 8, 6, 0)
    assert out["decode_tokens_per_s"] > 0 and out["fraction_of_bandwidth_bound"] > 0
    assert [w["window"] for w in out["windows"]] == [0, 2]
    for w in out["windows"]:
        assert w["same_tokens"] and w["decode_tokens_per_s"] > 0
        assert w["fraction_of_bandwidth_bound"] > 0
    for args, problem in (
        (["--prompt-len", "8", "--rows", "5", "--prompts", "2", "--no-peer"], "--rows 5"),
        (["--rows", "4", "--no-peer"], "add --prompt-len"),
        (["--model", "", "--no-peer"], '--model ""'),
        (["--windows", "0,-4", "--no-peer"], "--windows '0,-4'"),
    ):
        with pytest.raises(SystemExit):
            bench.main(["sample", "--random-init", "tiny-qwen2", *args])
        assert problem in capsys.readouterr().err


@pytest.mark.slow
def test_bench_lab_reports_the_base_models_regime_and_a_steps_shares(tmp_path, monkeypatch):
    """At the smoke size (a base model of 2 SFT steps, in this test's cache): Pass@k is
    monotone in k, each part's questions add up, zero-advantage groups are a share, and
    the RL step's parts (rollout, pi_old, update, host) add up to the step."""
    from explore_rl.evaluation import evaluate as evaluate_lib

    monkeypatch.setenv("EXPLORE_RL_CACHE_DIR", str(tmp_path))
    specs, real = [], evaluate_lib.evaluate
    monkeypatch.setattr(
        evaluate_lib, "evaluate", lambda *a, **k: specs.append(a[4]) or real(*a, **k)
    )
    out = bench.main(["lab", "--config", "configs/lab.py:smoke", "--samples", "4",
                      "--group", "2", "--rl-steps", "2"])  # fmt: skip
    assert out["base_build_s"] > 0 and out["test_questions"] == 16 and out["samples"] == 4
    assert all(s.eval.sampling.stop_ids for s in specs)  # every evaluation ends at EOS
    assert out["seen"]["questions"] + out.get("unseen", {"questions": 0})["questions"] == 16
    for part in ("all", "seen"):
        p = out[part]
        assert 0 <= p["pass@1"] <= p["pass@4"] <= 1 and 0 <= p["zero_advantage_groups"] <= 1
    shares = out["rl_step_share"]
    assert abs(sum(shares.values()) - 1) < 1e-6 and shares["update_s"] > 0
    assert out["rl_step_s_median"] > 0


def test_bench_depth_compiles_each_depth_unrolled_and_scanned(capsys):
    """Abstract shapes only (a 1.5B at 28 layers compiles on a laptop): each depth both
    ways, the ratio of their compile times and the scanned program's extra temporaries
    beside the estimate's stacked-layers term. Bad input: one line."""
    out = bench.main(["depth", "--preset", "tiny-llama", "--layers", "2", "--length", "4",
                      "--prompt-len", "4", "--dtype", "float32"])  # fmt: skip
    assert [(r["layers"], r["mode"]) for r in out["runs"]] == [(2, "unrolled"), (2, "scanned")]
    for r in out["runs"]:
        assert min(r["compile_s"], r["prefill_compile_s"], r["decode_compile_s"]) > 0
    (depth,) = out["by_depth"]
    ratio = out["runs"][1]["compile_s"] / out["runs"][0]["compile_s"]
    assert abs(depth["scanned_over_unrolled_compile"] - ratio) < 0.01 * ratio + 0.01
    for args, problem in ((["--layers", "0,28"], "--layers"), (["--preset", "gpt5"], "--preset")):
        with pytest.raises(SystemExit):
            bench.main(["depth", *args])
        assert problem in capsys.readouterr().err


def test_bench_long_fits_each_modes_exponent_from_the_bytes_measured():
    """The exponent of the memory above the length-free part, k in y ~ T^k, from each
    run's unrounded bytes (a tiny model's parts round to 0.0 GiB); none where one length
    or a part measured at zero leaves nothing to fit."""
    from explore_rl.bench.long import exponents

    def run(mode, length, update, prefill):
        return {"mode": mode, "length": length, "update_above_resident_bytes": update,
                "prefill_above_params_bytes": prefill}  # fmt: skip

    runs = [run("long", t, 3 * t**1.5, 40 * t) for t in (64, 128, 512)]  # exact powers
    runs += [run("dense", 64, 5 * 64**2, 0), run("scan", 64, 10, 0), run("scan", 128, 20, 9)]
    assert exponents(runs) == {
        "dense/update": None, "dense/prefill": None,  # one length
        "long/update": 1.5, "long/prefill": 1.0,
        "scan/update": 1.0, "scan/prefill": None,  # a part measured at zero
    }  # fmt: skip
