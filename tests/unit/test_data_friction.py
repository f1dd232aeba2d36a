"""Issue 17's friction list, data side: npz train+test files, the split made here said aloud,
float64 noted or converted (--dtype), inspect --grid of 1-D samples."""
import numpy as np


def seq(n, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 1, 12)).astype(dtype), rng.integers(0, 3, n)


def test_npz_train_and_test_files_become_both_splits(tmp_path, capsys):
    from hpctrain.data_tools.cli import main as tools_main
    from hpctrain.data import read_index
    x, y = seq(40, 0)
    xt, yt = seq(10, 1)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=xt, y=yt)
    for args in (["--test-file", str(tmp_path / "test.npz")], [str(tmp_path / "test.npz")]):
        out = str(tmp_path / f"ds{len(args)}")
        assert tools_main(["convert", "--from", "npz", str(tmp_path / "train.npz"), *args, "--out", out,
                           "--no-progress"]) == 0
        text = capsys.readouterr().out
        assert "train 40, test 10" in text and f"test split: {tmp_path / 'test.npz'}" in text
        idx = read_index(out)
        assert idx.num_samples("train") == 40 and idx.num_samples("test") == 10


def test_npz_split_made_here_is_said(tmp_path, capsys):
    from hpctrain.data_tools.cli import main as tools_main
    x, y = seq(50, 0)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "a.npz"), "--out", str(tmp_path / "d"),
                       "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "has no test split" in text and "10 of its 50 samples (20%" in text and "--test-file" in text


def test_npz_test_file_errors(tmp_path, capsys):
    from hpctrain.data_tools.cli import main as tools_main
    x, y = seq(20, 0)
    np.savez(tmp_path / "both.npz", x=x, y=y, x_test=x, y_test=y)
    np.savez(tmp_path / "t.npz", x=x)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "both.npz"), str(tmp_path / "a.npz"),
                       "--out", str(tmp_path / "d1"), "--no-progress"]) == 2
    assert "use one of them" in capsys.readouterr().err
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "a.npz"), "--test-file", str(tmp_path / "t.npz"),
                       "--out", str(tmp_path / "d2"), "--no-progress"]) == 2
    assert "missing array 'y'" in capsys.readouterr().err
    assert tools_main(["convert", "--from", "digits", "--test-file", "x.npz", "--out", str(tmp_path / "d3")]) == 2
    assert "a test file is read by --from npz only" in capsys.readouterr().err


def test_float64_note_and_dtype_option(tmp_path, capsys):
    from hpctrain.data_tools.cli import main as tools_main
    from hpctrain.data import ShardSet, read_index
    x, y = seq(30, 0, np.float64)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "a.npz"), "--out", str(tmp_path / "d64"),
                       "--no-progress"]) == 0
    assert "--dtype float32 halves" in capsys.readouterr().out
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "a.npz"), "--out", str(tmp_path / "d32"),
                       "--dtype", "float32", "--no-progress"]) == 0
    assert "from float64 to float32" in capsys.readouterr().out
    idx = read_index(str(tmp_path / "d32"))
    assert idx.dtype == "float32"
    s = ShardSet(idx, "train", driver="serial")
    try:
        xs, _ = s.read_range(0, 3)
    finally:
        s.close()
    assert xs.dtype == np.float32
    big = np.full((4, 1, 3), 1e6)
    np.savez(tmp_path / "big.npz", x=big, y=np.zeros(4, int), x_test=big, y_test=np.zeros(4, int))
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "big.npz"), "--out", str(tmp_path / "d16"),
                       "--dtype", "float16", "--no-progress"]) == 2
    assert "overflows float16" in capsys.readouterr().err
    np.savez(tmp_path / "u8.npz", x=np.zeros((4, 1, 3), np.uint8), y=np.zeros(4, int))
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "u8.npz"), "--out", str(tmp_path / "du8"),
                       "--dtype", "float32", "--no-progress"]) == 2
    assert "converts float samples" in capsys.readouterr().err


# --- inspect --grid of 1-D samples -----------------------------------------------------------------
def test_inspect_grid_plots_1d_samples(tmp_path, capsys):
    from hpctrain.data_tools.cli import main as tools_main
    x, y = seq(20, 0)
    np.savez(tmp_path / "a.npz", x=x[:, 0, :], y=y)           # (N, 12): samples of shape (12,)
    out = str(tmp_path / "d")
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "a.npz"), "--out", out, "--no-progress"]) == 0
    png = tmp_path / "g.png"
    assert tools_main(["inspect", out, "--grid", str(png), "-n", "6"]) == 0
    assert "line plots" in capsys.readouterr().out
    from PIL import Image
    with Image.open(png) as im:
        assert im.size[0] > 100 and im.size[1] > 100
    # (N, C, L) sequences draw one line per channel
    np.savez(tmp_path / "b.npz", x=np.repeat(x, 2, axis=1), y=y)
    out2 = str(tmp_path / "d2")
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "b.npz"), "--out", out2, "--no-progress"]) == 0
    assert tools_main(["inspect", out2, "--grid", str(tmp_path / "g2.png")]) == 0
