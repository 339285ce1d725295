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
