
import pydantic
import pytest
import yaml

from pipeline.core.config import load_config, parse_override, with_overrides, write_resolved
from pipeline.core.errors import PipelineError
from pipeline.core.params_schema import DEFAULTS, SECTIONS, section_fields

from helpers import REPO, speed_only_keys


def test_params_yaml_matches_defaults_except_data_dir():
    # params.yaml is the documented default run: it must not drift from the code defaults
    cfg = load_config(REPO / "params.yaml")
    assert cfg.data.dir == "data/demo"
    assert cfg.model_copy(update={"data": cfg.data.model_copy(update={"dir": None})}) == DEFAULTS
    # and it spells out every param (DVC reads the ones a stage lists from it)
    assert set(flatten(yaml.safe_load((REPO / "params.yaml").read_text()))) == set(flatten(DEFAULTS.model_dump()))


# what recipes/cpu.yaml said before recipes listed only what they change (plus the SGD weight
# decay, the crop expand and the upsampled maps screened since): the merged slim recipe must still be exactly this run
CPU_RECIPE_CHANGES = {
    "data.dir": "../shared/data/ibug300w-mini", "data.label_origin": 1.0,
    "data.extra_train": {"lfpw": "../shared/data/lfpw-train"}, "crop.side": 128, "crop.expand": 1.40,
    "folds.k": 3, "folds.train": [0, 1, 2], "model.input_size": 128,
    "model.options": {"decoder_levels": 3, "map_upsample": 2}, "train.epochs": 48, "train.batch_size": 32, "train.optimizer": "sgd",
    "train.lr": 0.8, "train.weight_decay": 5.0e-4, "train.warmup_epochs": 3.0, "train.heatmap_sigma": 0.5,
    "train.val_every": 4, "predict.tta_jitter": 0.05, "submit.name": "resunet-tiny-cpu",
    "video.box_w_scale": 1.035, "video.box_h_scale": 1.07, "video.box_dy": -0.09}


def test_merged_cpu_recipe_is_the_full_recipe_it_replaced():
    merged = flatten(load_config(REPO / "recipes" / "cpu.yaml").model_dump())
    assert merged == {**flatten(DEFAULTS.model_dump()), **CPU_RECIPE_CHANGES}
    assert all(type(merged[k]) is type(v) for k, v in CPU_RECIPE_CHANGES.items())


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_recipes_load_and_merge_into_a_complete_params_file(recipe, tmp_path):
    """`make repro RECIPE=...` writes the recipe merged over the defaults to params.yaml:
    every key, the recipe's values, and it loads back to the same config."""
    from pipeline.tools.params import merged_params_text

    cfg = load_config(recipe)
    out = tmp_path / "params.yaml"
    out.write_text(merged_params_text(recipe))
    assert set(flatten(yaml.safe_load(out.read_text()))) == set(flatten(DEFAULTS.model_dump()))
    assert load_config(out) == cfg


def test_params_doc_is_current():
    """docs/params.md is generated from the models: regenerate with `pipeline params --doc`."""
    from pipeline.tools.params import params_doc

    assert (REPO / "docs" / "params.md").read_text() == params_doc(), "run `pipeline params --doc`"


def test_every_field_has_a_doc_and_speed_only_is_crop_n_jobs():
    for s in SECTIONS:
        for name, field in section_fields(s).items():
            assert field.description, f"{s}.{name}"
    assert speed_only_keys() == {"crop.n_jobs"}


def test_resolved_params_leave_out_speed_only():
    cfg = load_config(None, ["crop.n_jobs=5"])
    assert "n_jobs" not in write_resolved_text(cfg, ["crop"])["crop"]


def test_override_beats_file(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("train:\n  lr: 0.5\n  epochs: 3\n")
    cfg = load_config(p, ["train.lr=0.1", "model.options={width: 0.5}"])
    assert cfg.train.lr == 0.1 and cfg.train.epochs == 3
    assert cfg.model.options == {"width": 0.5}
    assert cfg.train.batch_size == DEFAULTS.train.batch_size


def test_override_below_a_mapping_keeps_its_other_keys(tmp_path):
    # a recipe's model.options must survive `--set model.options.X=...` (bench variants, screens)
    p = tmp_path / "p.yaml"
    p.write_text("model:\n  options:\n    decoder_levels: 4\n    stem_widths: [8, 8, 16]\n")
    cfg = load_config(p, ["model.options.depths=[1, 1, 2, 2]"])
    assert cfg.model.options == {"decoder_levels": 4, "stem_widths": [8, 8, 16], "depths": [1, 1, 2, 2]}
    # a path below a mapping inside the mapping: copied down to the leaf, its other keys kept
    nested = cfg.model_copy(update={"model": cfg.model.model_copy(update={"options": {"stem": {"a": 1}}})})
    assert parse_override("model.options.stem.b=2", nested) == {"model": {"options": {"stem": {"a": 1, "b": 2}}}}
    cfg = load_config(p, ["model.options={width: 0.5}"])  # the mapping itself: replaced whole
    assert cfg.model.options == {"width": 0.5}
    assert load_config(p).model.options == {"decoder_levels": 4, "stem_widths": [8, 8, 16]}  # not mutated


def test_null_mapping_means_empty_but_a_nullable_one_stays_null(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("data:\n  extra_train:\n  custom_schema:\nmodel:\n  options:\n")
    cfg = load_config(p)
    assert cfg.data.extra_train == {} and cfg.model.options == {} and cfg.data.custom_schema is None


def test_int_accepted_for_float_and_stored_as_float(tmp_path):
    cfg = load_config(None, ["train.lr=1"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


@pytest.mark.parametrize("text, needle", [
    ("train:\n  lrr: 0.1\n", "unknown key 'train.lrr'"),
    ("nosuch:\n  a: 1\n", "unknown key 'nosuch'"),
    ("train:\n  epochs: ten\n", "'train.epochs' must be int"),
    ("train:\n  epochs: 2.5\n", "'train.epochs' must be int"),
    ("predict:\n  tta: [1]\n", "'predict.tta' must be string"),
    ("train: 3\n", "'train' must be a mapping"),
    ("train:\n  lr: [\n", "invalid YAML"),
    ("train:\n  1: 2\n", "unknown key 'train.1'"),
    ("train:\n  lr: -1\n  lrr: 0.1\n", "unknown key 'train.lrr'"),  # a misspelt key before a bad value
    ("model:\n  in_chans: 2\n", "'model.in_chans' must be 1 or 3, got 2"),
    ("model:\n  in_chans: 3.0\n", "'model.in_chans' must be int, got 3.0"),
    ("data:\n  extra_train: {a: 5}\n", "'data.extra_train' must be a mapping of names (letters"),
])
def test_bad_params_file_names_file_and_key(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(PipelineError) as e:
        load_config(p)
    assert needle in str(e.value) and str(p) in str(e.value)


def test_missing_explicit_params_file_is_an_error(tmp_path):
    with pytest.raises(PipelineError, match="params file not found"):
        load_config(tmp_path / "nope.yaml")


def test_params_path_that_is_a_folder_is_an_error_but_a_missing_default_means_defaults(tmp_path, monkeypatch):
    with pytest.raises(PipelineError, match="is a directory, expected a params YAML file"):
        load_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert load_config("params.yaml") == DEFAULTS
    (tmp_path / "params.yaml").mkdir()
    with pytest.raises(PipelineError, match="is a directory, expected a params YAML file"):
        load_config("params.yaml")


def test_parse_override_nested_and_malformed():
    assert parse_override("a.b.c=3") == {"a": {"b": {"c": 3}}}
    with pytest.raises(PipelineError):
        parse_override("novalue")


def test_parse_override_control_character_is_a_pipeline_error():
    """YAML's ReaderError (a control character) carries no `problem`: still a one-line
    PipelineError naming --set, not an AttributeError."""
    with pytest.raises(PipelineError, match=r"--set: cannot parse value of 'a': unacceptable character"):
        parse_override("a=\x07")


def test_write_resolved_only_named_sections(tmp_path):
    cfg = load_config(None, ["train.epochs=7"])
    path = write_resolved(cfg, tmp_path, ["train"])
    data = yaml.safe_load(path.read_text())
    assert list(data) == ["train"] and data["train"]["epochs"] == 7
    assert path.read_text() == yaml.safe_dump({"train": cfg.train.model_dump()}, sort_keys=False)


@pytest.mark.parametrize("text, needle", [
    ("crop:\n  expand: .nan\n", "'crop.expand' must be a finite number, got nan"),
    ("crop:\n  expand: .inf\n", "'crop.expand' must be a finite number, got inf"),
    ("crop:\n  expand: 0\n", "'crop.expand' must be a number in (0, 10]"),
    ("crop:\n  side: 100000\n", "'crop.side' must be an integer in [8, 4096]"),
    ("train:\n  batch_size: 0\n", "'train.batch_size' must be an integer >= 1, got 0"),
    ("train:\n  lr: .nan\n", "'train.lr' must be a finite number"),
    ("train:\n  lr: -0.1\n", "'train.lr' must be a number > 0"),
    ("train:\n  epochs: -3\n", "'train.epochs' must be an integer >= 1, got -3"),
    ("train:\n  seed: -1\n", "'train.seed' must be an integer >= 0, got -1"),
    ("train:\n  flip: 1.5\n", "'train.flip' must be a number in [0, 1]"),
    ("train:\n  channels_last: sometimes\n", "'train.channels_last' must be auto, on or off"),
    ("folds:\n  k: 1\n", "'folds.k' must be an integer >= 2, got 1"),
    ("folds:\n  train: [-1]\n", "'folds.train' must be a list of fold numbers"),
    ("folds:\n  group_regex: '(unclosed'\n", "'folds.group_regex' must be a regex with a named group"),
    ("folds:\n  group_regex: '^(.+)_\\d+$'\n", "'folds.group_regex' must be a regex with a named group"),
    ("demo:\n  layout: 500w\n", "'demo.layout' must be flat or 300w"),
    ("predict:\n  calibrate: sometimes\n", "'predict.calibrate' must be auto, on or off"),
    ("train:\n  heatmap_lambda: -1\n", "'train.heatmap_lambda' must be a number in [0, 1e+06]"),
    ("train:\n  heatmap_sigma: 0\n", "'train.heatmap_sigma' must be a number in (0, 1000]"),
    ("data:\n  label_origin: .inf\n", "'data.label_origin' must be a finite number"),
    ("train:\n  lr: 0.1\n  lr: 0.2\n", "duplicated key 'lr' (also on line 2)"),
    ("train:\n  lr: 0.1\ntrain:\n  epochs: 2\n", "duplicated key 'train' (also on line 1)"),
])
def test_out_of_range_and_duplicated_keys_name_the_file(tmp_path, text, needle):
    """A value out of its range (NaN, inf, 0, negative) or a key given twice is refused
    with the params file named, the one actually read (not params.yaml)."""
    p = tmp_path / "other.yaml"
    p.write_text(text)
    with pytest.raises(PipelineError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}: ") and needle in str(e.value), str(e.value)


@pytest.mark.parametrize("override, needle", [
    ("crop.expand=0", "--set crop.expand=0: 'crop.expand' must be a number in (0, 10]"),
    ("train.batch_size=0", "--set train.batch_size=0: 'train.batch_size' must be an integer >= 1"),
    ("train.lr=1e999", "--set train.lr=1e999: 'train.lr' must be a finite number"),
])
def test_out_of_range_override_names_the_set(override, needle):
    with pytest.raises(PipelineError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(needle), str(e.value)


@pytest.mark.parametrize("typed, want", [("on", "on"), ("off", "off"), ("true", "on"), ("false", "off"),
                                          ("yes", "on"), ("auto", "auto"), ("ON", "on")])
def test_switches_accept_what_users_type(tmp_path, typed, want):
    cfg = load_config(None, [f"train.channels_last={typed}", f"train.amp={typed}"])
    assert cfg.train.channels_last == want and cfg.train.amp == want
    p = tmp_path / "p.yaml"
    p.write_text(f"train:\n  channels_last: {typed}\n  amp: {typed}\n")
    cfg = load_config(p)
    assert cfg.train.channels_last == want and cfg.train.amp == want


def test_amp_on_means_enabled_where_it_can_run():
    import torch

    from pipeline.core.device import amp_dtype, use_channels_last

    assert amp_dtype("on", torch.device("cpu")) == torch.bfloat16
    assert amp_dtype("off", torch.device("cpu")) is None
    assert amp_dtype("auto", torch.device("cpu"), native_cpu_bf16=False) is None
    assert use_channels_last("on", torch.device("cpu")) and not use_channels_last("off", torch.device("cpu"))


def test_no_param_named_size_or_nfiles():
    """DVC's run cache drops params named `size` or `nfiles` at any depth from its key
    (treeverse/dvc#10296): a change of one would re-use a stale result."""
    bad = [f"{s}.{k}" for s in SECTIONS for k in section_fields(s) if k in ("size", "nfiles")]
    assert not bad
    for path in [REPO / "params.yaml", *sorted((REPO / "recipes").glob("*.yaml"))]:
        def walk(d, prefix="", path=path):
            for k, v in d.items():
                assert k not in ("size", "nfiles"), f"{path}: {prefix}{k}"
                if isinstance(v, dict):
                    walk(v, f"{prefix}{k}.")
        walk(yaml.safe_load(path.read_text()))


def test_late_param_errors_name_the_set_or_the_file_read(tmp_path):
    """A param found bad after loading (unknown schema) is blamed on the --set that gave
    it, else on the params file actually read."""
    from pipeline.keypoints.schema import get_schema

    cfg = load_config(None, ["train.lr=0.1", "data.schema=nosuch"])
    with pytest.raises(PipelineError, match=r"^--set data.schema=nosuch: data.schema: unknown schema"):
        get_schema(cfg.data)
    p = tmp_path / "other.yaml"
    p.write_text("data:\n  schema: nosuch\n")
    cfg = load_config(p, ["train.lr=0.1"])
    with pytest.raises(PipelineError, match=rf"^{p}: data.schema: unknown schema"):
        get_schema(cfg.data)


def test_every_auto_on_off_param_is_a_switch():
    """Every field defaulting to auto/on/off accepts YAML's booleans as on/off; a string
    field with other choices does not."""
    from pipeline.core.params_schema import is_switch

    switches = [f"{s}.{k}" for s in SECTIONS for k, f in section_fields(s).items() if is_switch(f)]
    assert {"train.amp", "train.channels_last", "predict.calibrate", "video.smooth"} <= set(switches)
    for key in switches:
        section, name = key.split(".")
        assert getattr(getattr(load_config(None, [f"{key}=true"]), section), name) == "on", key
    with pytest.raises(PipelineError, match="'predict.tta' must be string, got True"):
        load_config(None, ["predict.tta=on"])  # none|flip is not a switch


def test_config_is_frozen_and_typed():
    cfg = load_config(None)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        cfg.train.lr = 0.5  # type: ignore[misc]
    with pytest.raises(PipelineError, match="'model.in_chans' must be int, got True"):
        load_config(None, ["model.in_chans=true"])
    with pytest.raises(PipelineError, match="'crop.n_jobs' must be a nonzero integer"):
        load_config(None, ["crop.n_jobs=0"])
    with pytest.raises(PipelineError, match="'train.optimizer' must be adamw or sgd, got 'adam'"):
        load_config(None, ["train.optimizer=adam"])


def flatten(d):
    return {k: v for s, sec in d.items() for k, v in ((f"{s}.{n}", x) for n, x in sec.items())}


def write_resolved_text(cfg, sections):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        return yaml.safe_load(write_resolved(cfg, Path(d), sections).read_text())


# ------------------------------------------------- cross-field checks at load (issue 48, finding 5)

@pytest.mark.parametrize("text, needle", [
    ("train:\n  scale_min: 2\n  scale_max: 1.5\n", "'train.scale_min' 2 must be <= 'train.scale_max' 1.5"),
    ("folds:\n  k: 3\n  train: [0, 3]\n", "'folds.train' [0, 3] must name folds of 'folds.k' 3 (0..2)"),
    ("folds:\n  k: 5\n  train: [7]\n", "'folds.train' [7] must name folds of 'folds.k' 5 (0..4)"),
    ("folds:\n  k: 3\n  train: [0, 0]\n", "'folds.train' [0, 0] names fold 0 twice"),
    ("model:\n  preset: resunet-huge\n", "'model.preset' must be a registered preset"),
    ("model:\n  options: {nosuch: 1}\n", "'model.options' of preset 'resunet-tiny': unknown option 'nosuch'"),
    ("model:\n  options: {width: wide}\n",
     "'model.options.width' of preset 'resunet-tiny' must be a number, got 'wide'"),
    ("model:\n  options: {depths: [1, 1.5, 2, 2]}\n",
     "'model.options.depths' of preset 'resunet-tiny' must be a list of integers, got [1, 1.5, 2, 2]"),
    ("model:\n  options: {blurpool: 1}\n", "'model.options.blurpool' of preset 'resunet-tiny' must be true or false, got 1"),
    ("model:\n  preset: vgg-seed\n  options: {decoder_levels: 3}\n",
     "'model.options' of preset 'vgg-seed': unknown option 'decoder_levels'"),
    ("model:\n  preset: resnet50-fc\n  options: {width: 0.5}\n",
     "'model.options' of preset 'resnet50-fc': unknown option 'width' (known: none)"),
])
def test_cross_field_problems_are_refused_at_load_naming_the_keys(tmp_path, text, needle):
    """Issue 48, finding 5: a reversed scale range, training folds beyond folds.k or named
    twice, and a preset's option that it does not take or of the wrong type are refused
    while loading (one line naming the file and the keys), not at training start or model
    build."""
    p = tmp_path / "other.yaml"
    p.write_text(text)
    with pytest.raises(PipelineError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}: ") and needle in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_cross_field_problems_blame_the_set_and_are_checked_after_every_override(tmp_path):
    """The check runs once the file and every --set are merged: overrides that together
    make a valid config pass (--set folds.k=2 --set folds.train=[0,1] over k 5); a --set
    that breaks a rule is named."""
    p = tmp_path / "p.yaml"
    p.write_text("folds:\n  k: 5\n  train: [0, 1, 2, 3, 4]\n")
    cfg = load_config(p, ["folds.k=2", "folds.train=[0,1]"])
    assert (cfg.folds.k, cfg.folds.train) == (2, [0, 1])
    with pytest.raises(PipelineError, match=r"^--set folds.k=2: 'folds.train' \[0, 1, 2, 3, 4\] must name folds"):
        load_config(p, ["folds.k=2"])
    with pytest.raises(PipelineError, match=r"^--set train.scale_min=2: 'train.scale_min' 2 must be <= "):
        load_config(None, ["train.scale_min=2"])
    with pytest.raises(PipelineError, match=r"^--set model.options.act=1: 'model.options.act' of preset "
                                            r"'resunet-tiny' must be a string, got 1"):
        load_config(None, ["model.options.act=1"])
    # the options a recipe gives pass, and a preset's own options pass for it
    assert load_config(None, ["model.options={decoder_levels: 3, map_upsample: 2, decoder_widths: null}"])
    assert load_config(None, ["model.preset=vgg-seed", "model.options={widths: [8, 16], convs: [1, 1]}"])


def test_with_overrides_blames_its_own_set_not_only_those_loaded(tmp_path):
    """A caller's overrides (bench's variants) are not among load_config's --set: a rule
    one of them breaks still names that --set, not the params file."""
    p = tmp_path / "p.yaml"
    p.write_text("folds:\n  k: 5\n  train: [0, 1, 2, 3, 4]\n")
    cfg = load_config(p, ["train.lr=0.01"])
    with pytest.raises(PipelineError, match=r"^--set folds.k=2: 'folds.train' \[0, 1, 2, 3, 4\] must name folds"):
        with_overrides(cfg, ["folds.k=2"])
