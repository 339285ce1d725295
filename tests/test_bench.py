"""`bench scale` (sized for a GPU) runs on the CPU at a small size and reports every number
it promises, each from a real measurement."""

from explore_rl import bench


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
    """Each slot count as the bench's own process runs it (the README runs the whole
    command, a process per count)."""
    common = ["engine", "--random-init", "tiny-llama", "--prompts", "2", "--group", "4",
              "--new-tokens", "8", "--chunk", "2", "--only"]  # fmt: skip
    one, slotted = (bench.main([*common, s])["runs"][0] for s in ("0", "3"))
    assert (one["slots"], slotted["slots"]) == (0, 3)
    # the same rows whatever the slots
    assert one["rows"] == slotted["rows"] and one["useful_tokens"] == slotted["useful_tokens"] > 0
    assert one["refills"] == 0 and slotted["refills"] == 8 - 3
    for r in (one, slotted):
        for key in ("useful_tokens_per_s", "occupancy", "prefill_s", "decode_s", "peak_rss_gib"):
            assert r[key] > 0, (r["slots"], key)
        assert 0 < r["occupancy"] <= 1 and r["kv_cache_bytes"] > 0
