"""SSD input sources: synthetic in memory, TFRecords the test writes (both schemas), TFDS coco/2017 under mock_data,
the SSD random crop, and one clear HarnessError per bad input."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import synthetic_shapes, tfrecord_writer
from benchmarks.ssd.coco_metric import coco_category_ids, evaluate, load_ground_truth
from benchmarks.ssd.config import DataConfig, ModelConfig
from benchmarks.ssd.data import (BAD_BOX, MEAN_RGB, STD_RGB, UNMAPPED, color_jitter, device_image, jitter_factors,
                                 make_source, sample_ssd_crop, ssd_random_crop)
from harness.errors import HarnessError
from harness.runtime.base import InputContext

S = 32
MODEL = ModelConfig(image_size=S)


def ctx(seed: int = 3, hosts: int = 1, host: int = 0) -> InputContext:
    return InputContext(num_hosts=hosts, host_id=host, batch_size=4, seed=seed)


def synthetic(**kw) -> DataConfig:
    return DataConfig(**{"source": "synthetic", "train_samples": 48, "eval_samples": 12, "max_boxes": 5, **kw})


def take(ds: tf.data.Dataset, n: int) -> list[dict[str, np.ndarray]]:
    return list(ds.take(n).as_numpy_iterator())


def unnormalize(image: np.ndarray) -> np.ndarray:
    return np.rint((image * STD_RGB + MEAN_RGB) * 255).astype(np.int64)


def perfect_detections(gt) -> np.ndarray:
    anns = [a for a in gt.dataset["annotations"] if not a["iscrowd"]]
    return np.asarray([[a["image_id"], *a["bbox"], 1.0, a["category_id"]] for a in anns])


def check_element(el: dict, size: int, max_boxes: int, num_classes: int) -> None:
    assert el["image"].shape == (size, size, 3) and el["image"].dtype == np.float32
    if "jitter" in el:  # data.jitter_on_device: pixels (0..255 under data.scale_in_step, else [0, 1]) and draws
        scaled = el["image"].max() > 1  # what the train step would be told (Source.scales_in_step)
        assert el["jitter"].shape == (4,) and el["image"].min() >= 0 and el["image"].max() <= (255 if scaled else 1)
        el = {**el, "image": device_image({k: tf.constant(v)[None] for k, v in el.items()}, scaled).numpy()[0]}
    elif "flip" in el:  # data.flip_on_device: the image is mirrored in the train step
        el = {**el, "image": device_image({k: tf.constant(v)[None] for k, v in el.items()}).numpy()[0]}
    assert el["boxes"].shape == (max_boxes, 4) and el["boxes"].dtype == np.float32
    assert el["labels"].shape == (max_boxes,) and el["labels"].dtype == np.int32
    lo, hi = (0 - np.asarray(MEAN_RGB)) / STD_RGB, (1 - np.asarray(MEAN_RGB)) / STD_RGB
    assert np.all(el["image"] >= lo - 1e-5) and np.all(el["image"] <= hi + 1e-5)
    valid = el["labels"] > 0
    assert valid.any(), "an image without boxes reached training"
    k = int(valid.sum())
    assert valid[:k].all() and not valid[k:].any() and not el["boxes"][k:].any()  # boxes first, zero padding
    assert el["labels"].max() <= num_classes
    b = el["boxes"][:k]
    assert np.all((b >= 0) & (b <= 1)) and np.all(b[:, 0] <= b[:, 2]) and np.all(b[:, 1] <= b[:, 3])


# ------------------------------------------------------------------------------------------------- synthetic

def test_synthetic_train_elements_and_reproducibility():
    src = make_source(synthetic(max_samples=50), MODEL)
    assert src.category_map.category_ids == [1, 5, 9] and src.train_count() == 48
    els = take(src.train(ctx()), 60)
    for el in els:
        check_element(el, S, 5, 3)
    assert {int(v) for el in els for v in el["labels"]} == {0, 1, 2, 3}  # contiguous labels of ids 1, 5, 9
    again = take(make_source(synthetic(max_samples=50), MODEL).train(ctx()), 10)
    for a, b in zip(els, again):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    other = take(src.train(ctx(seed=4)), 10)
    assert any(not np.array_equal(a["image"], b["image"]) for a, b in zip(els, other))


def test_colour_jitter_on_device_is_the_host_jitter_batched():
    """data.jitter_on_device moves the ColorJitter pixel work into the train step: the same draws and formulas,
    so a batch jittered there equals the host-jittered elements (to float rounding)."""
    source = make_source(synthetic(), MODEL)
    on = take(source.train(ctx()), 8)
    off = take(make_source(synthetic(jitter_on_device=False), MODEL).train(ctx()), 8)
    assert all("jitter" in el for el in on) and not any("jitter" in el for el in off)
    assert source.scales_in_step  # the default: 0..255 float32 pixels, scaled in the step
    batch = {k: tf.constant(np.stack([el[k] for el in on])) for k in on[0]}
    batch_off = {k: tf.constant(np.stack([el[k] for el in off])) for k in off[0]}  # flipped in the step too
    np.testing.assert_allclose(device_image(batch, True).numpy(), device_image(batch_off).numpy(), atol=1e-5)
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a["boxes"], b["boxes"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
    factors = np.stack([el["jitter"] for el in on])
    assert len({tuple(f) for f in factors}) == 8  # drawn per image
    assert np.all(np.abs(factors[:, :3] - 1) <= [0.125, 0.5, 0.5]) and np.all(np.abs(factors[:, 3]) <= 0.05)
    # Against tf.image's fused kernels with the same draws (the host path before this option existed).
    rng = np.random.default_rng(0)
    image = tf.constant(rng.uniform(0, 1, (S, S, 3)).astype(np.float32))
    f = jitter_factors(tf.constant([3, 1], tf.int64))
    want = tf.clip_by_value(tf.image.adjust_contrast(tf.clip_by_value(image * f[0], 0, 1), f[1]), 0, 1)
    want = tf.image.adjust_hue(tf.clip_by_value(tf.image.adjust_saturation(want, f[2]), 0, 1), f[3])
    np.testing.assert_allclose(color_jitter(image, f).numpy(), tf.clip_by_value(want, 0, 1).numpy(), atol=1e-5)


def test_images_leave_the_host_in_the_compute_dtype():
    """data.images_in_compute_dtype: under bfloat16 the host sends bfloat16 images (train and eval), the
    model's first conv casts to it anyway (logits bit for bit), and device-jittered pixels are jittered in
    float32 after rounding; false keeps float32."""
    from benchmarks.ssd.model import SSD
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    on = make_source(synthetic(scale_in_step=False), MODEL, tf.bfloat16)  # the host scales to [0, 1]
    off = make_source(synthetic(images_in_compute_dtype=False, scale_in_step=False), MODEL, tf.bfloat16)
    a, b = take(on.train(ctx()), 4), take(off.train(ctx()), 4)
    assert {el["image"].dtype for el in a} == {np.dtype(tf.bfloat16.as_numpy_dtype)}
    assert b[0]["image"].dtype == np.float32
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["image"], y["image"].astype(tf.bfloat16.as_numpy_dtype))
        np.testing.assert_array_equal(x["jitter"], y["jitter"])
    jittered = device_image({k: tf.constant(np.stack([el[k] for el in a])) for k in a[0]})
    assert jittered.dtype == tf.float32
    np.testing.assert_allclose(jittered.numpy(), device_image({k: tf.constant(np.stack([el[k] for el in b]))
                                                               for k in b[0]}).numpy(), atol=2e-2)
    record = next(iter(on.eval_records()))
    assert on.eval_parse(record)["image"].dtype == tf.bfloat16
    from harness import config as config_lib
    smoke = config_lib.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                "configs", "ssd", "smoke.yaml"), []).model
    normalized = tf.constant(np.stack([el["image"] for el in take(make_source(synthetic(augment=False), smoke)
                                                                    .train(ctx()), 2)]))
    runtime = make_runtime(RuntimeConfig(precision="bfloat16"))
    with runtime.scope():
        model = SSD(runtime, 1, smoke, 1)
    loc_f, conf_f = model(normalized, training=False)
    loc_b, conf_b = model(tf.cast(normalized, tf.bfloat16), training=False)
    np.testing.assert_array_equal(loc_f.numpy(), loc_b.numpy())
    np.testing.assert_array_equal(conf_f.numpy(), conf_b.numpy())


def test_synthetic_keeps_exactly_train_samples_nonempty_images_and_shards_hosts():
    cfg = synthetic(augment=False, train_samples=40)
    src = make_source(cfg, MODEL)
    d = src.train_data()
    assert len(d["num_boxes"]) == 40 and (d["num_boxes"] > 0).all()
    # The generator's empties were skipped, so the kept image ids have gaps exactly at the empty images.
    full = synthetic_shapes.generate(int(d["image_ids"][-1]), split="train", image_size=S, max_boxes=3)
    assert list(d["image_ids"]) == list(np.flatnonzero(full["num_boxes"] > 0) + 1)

    def signatures(host: int) -> set:  # flip-invariant fingerprint of each image of one epoch
        els = take(src.train(ctx(hosts=2, host=host)), 20)
        return {tuple(unnormalize(el["image"]).sum(axis=(0, 1))) for el in els}
    a, b = signatures(0), signatures(1)
    assert len(a) == len(b) == 20 and not a & b


def test_synthetic_eval_ids_sizes_and_ground_truth(tmp_path):
    src = make_source(synthetic(), MODEL)
    records = list(src.eval_records().as_numpy_iterator())
    assert len(records) == 12
    image = src.eval_parse(tf.constant(records[3]))["image"]
    assert image.shape == (S, S, 3) and image.dtype == tf.float32
    raw = synthetic_shapes.generate(12, split="val", image_size=S, max_boxes=3)
    np.testing.assert_array_equal(unnormalize(image.numpy()), raw["images"][3])
    np.testing.assert_array_equal(src.eval_image_ids, np.arange(1, 13))
    assert src.eval_image_sizes.shape == (12, 2) and (src.eval_image_sizes == S).all()
    path = str(tmp_path / "instances_val.json")
    synthetic_shapes.write_coco_json(path, synthetic_shapes.coco_ground_truth(raw, "val"))
    gt, from_json = src.ground_truth(), load_ground_truth(path, src.eval_image_ids)
    assert gt.dataset["images"] == from_json.dataset["images"]
    assert gt.dataset["annotations"] == from_json.dataset["annotations"]
    assert evaluate(gt, perfect_detections(gt)) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------ random crop

@pytest.mark.parametrize("max_samples", [1, 50])
def test_random_crop_keeps_centred_boxes_inside(max_samples):
    """Traced once, as the input pipeline's map runs it (eagerly each pick's loop costs ~0.1 s)."""
    rng = np.random.default_rng(0)
    cropped = 0
    boxes_spec, seed_spec = tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([2], tf.int64)
    sample = tf.function(lambda b, s: sample_ssd_crop(b, s, max_samples), input_signature=[boxes_spec, seed_spec])
    crop = tf.function(lambda b, s: ssd_random_crop(tf.zeros([40, 60, 3], tf.uint8), b,
                                                    tf.range(1, tf.shape(b)[0] + 1), s, max_samples),
                       input_signature=[boxes_spec, seed_spec])
    for i in range(40):
        n = int(rng.integers(1, 4))
        lt = rng.uniform(0, 0.7, (n, 2))
        boxes = np.concatenate([lt, lt + rng.uniform(0.05, 0.3, (n, 2))], 1).astype(np.float32)
        seed = tf.constant([i, max_samples], tf.int64)
        window, keep = (t.numpy() for t in sample(boxes, seed))
        centres = 0.5 * (boxes[:, :2] + boxes[:, 2:])
        if not np.array_equal(window, [0, 0, 1, 1]):
            cropped += 1
            inside = np.all((centres > window[:2]) & (centres < window[2:]), axis=1)
            np.testing.assert_array_equal(keep, inside)
            assert keep.any()
            w, h = window[2] - window[0], window[3] - window[1]
            assert 0.3 <= w <= 1 and 0.3 <= h <= 1 and 0.5 <= w / h <= 2
        img, out, labels = crop(boxes, seed)
        out = out.numpy()
        assert len(out) == len(labels) == keep.sum() >= 1
        assert np.all((out >= 0) & (out <= 1)) and np.all(out[:, :2] <= out[:, 2:])
        assert img.shape[0] >= 1 and img.shape[1] >= 1
    assert cropped >= 10  # 6 of the 7 options crop


def test_random_crop_without_boxes_falls_back_to_whole_image():
    window, keep = sample_ssd_crop(tf.zeros([0, 4]), tf.constant([1, 2], tf.int64), 50)
    np.testing.assert_array_equal(window.numpy(), [0, 0, 1, 1])
    assert keep.shape == (0,)


# ------------------------------------------------------------------------------------------------- TFRecords

def tfrecord_cfg(out: dict, **kw) -> DataConfig:
    """Records in file order (shuffle_buffer 1): the default 10,000-record buffer over a few records repeated
    would fill with ~1,000 epochs before the first element."""
    return DataConfig(**{"source": "tfrecord", "data_dir": os.path.dirname(out["val_json"]),
                         "annotation_file": out["val_json"], "train_samples": 16, "eval_samples": 10,
                         "max_boxes": 5, "augment": False, "shuffle_buffer": 1, **kw})


@pytest.mark.parametrize("with_label", [True, False], ids=["tpu_schema", "od_api_schema"])
def test_tfrecord_round_trip(tmp_path, with_label):
    out = tfrecord_writer.write_synthetic(str(tmp_path), 16, 10, image_size=S, seed=2, num_shards=2,
                                          with_label=with_label, empty_fraction=0.3)
    assert [os.path.basename(p) for p in out["train"]] == ["train-00000-of-00002.tfrecord",
                                                           "train-00001-of-00002.tfrecord"]
    train = synthetic_shapes.generate(16, split="train", seed=2, image_size=S, max_boxes=3, empty_fraction=0.3)
    nonempty = np.flatnonzero(train["num_boxes"] > 0)
    with pytest.raises(HarnessError, match=f"data.train_samples=16 but train-\\* under .* holds {len(nonempty)} images "
                                           f"with boxes; set data.train_samples={len(nonempty)}$"):
        make_source(tfrecord_cfg(out), MODEL).validate()
    src = make_source(tfrecord_cfg(out, train_samples=len(nonempty)), MODEL)
    src.validate()
    assert src.category_map.category_ids == [1, 5, 9]
    val = synthetic_shapes.generate(10, split="val", seed=2, image_size=S, max_boxes=3, empty_fraction=0.3)
    assert sorted(src.eval_image_ids.tolist()) == list(range(1, 11)) and (src.eval_image_sizes == S).all()
    gt = src.ground_truth()
    assert sorted(gt.getImgIds()) == list(range(1, 11))
    assert len(gt.getAnnIds()) == int(val["num_boxes"].sum()) and (val["num_boxes"] == 0).any()
    assert evaluate(gt, perfect_detections(gt)) == pytest.approx(1.0)
    records = list(src.eval_records().as_numpy_iterator())
    for rec, image_id in zip(records, src.eval_image_ids):
        image = src.eval_parse(tf.constant(rec))["image"].numpy()
        np.testing.assert_array_equal(unnormalize(image), val["images"][image_id - 1])

    assert 0 < len(nonempty) < 16
    labels = src.category_map.to_label(train["labels"])
    seen = set()
    for el in take(src.train(ctx()), 2 * len(nonempty)):
        check_element(el, S, 5, 3)
        pixels = unnormalize(el["image"][:, ::-1] if el.get("flip", False) else el["image"])  # as the step flips
        for j in nonempty:  # find the generated image (maybe flipped) and compare its boxes
            k = int(train["num_boxes"][j])
            want = train["boxes"][j, :k]
            if np.array_equal(pixels, train["images"][j]):
                got = el["boxes"][:k]
            elif np.array_equal(pixels, train["images"][j][:, ::-1]):
                got = el["boxes"][:k][:, [2, 1, 0, 3]] * [-1, 1, -1, 1] + [1, 0, 1, 0]
            else:
                continue
            np.testing.assert_allclose(got, want, atol=1e-6)
            np.testing.assert_array_equal(el["labels"][:k], labels[j, :k])
            seen.add(int(j))
            break
        else:
            raise AssertionError("a training element matches no generated image with boxes")
    assert seen == set(nonempty.tolist())


# ------------------------------------------------------------------------------------------------------ TFDS

def tfds_examples(features, n: int, bad_box: bool = False) -> list[bytes]:
    """Consistent coco/2017 examples serialized through TFDS's own features (labels 0, 4, 79 = ids 1, 5, 90)."""
    data = synthetic_shapes.generate(n, split="val", image_size=S, max_boxes=3, empty_fraction=0.3)
    out = []
    for i in range(n):
        k = int(data["num_boxes"][i])
        ltrb = data["boxes"][i, :k]
        label = np.asarray([{1: 0, 5: 4, 9: 79}[int(c)] for c in data["labels"][i, :k]], np.int64)
        record = features.serialize_example({
            "image": data["images"][i], "image/filename": f"{i}.jpg", "image/id": 100 + i,
            "objects": {"id": np.arange(k), "area": np.full(k, 7), "bbox": ltrb[:, [1, 0, 3, 2]].reshape(-1, 4),
                        "label": label, "is_crowd": np.zeros(k, bool)}})
        if bad_box and k:  # TFDS refuses to encode such a box, so corrupt the serialized record instead
            ex = tf.train.Example.FromString(record)
            ex.features.feature["objects/bbox"].float_list.value[3] = 1.5  # xmax of the first box
            record = ex.SerializeToString()
        out.append(record)
    return out


def mock_coco(n: int, bad_box: bool = False):
    import tensorflow_datasets as tfds

    def as_dataset(self, split, decoders=None, read_config=None, **kwargs):
        features = self.info.features
        ds = tf.data.Dataset.from_tensor_slices(tfds_examples(features, n, bad_box))
        return ds.map(lambda s: features.deserialize_example(s, decoders=decoders))
    return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def test_tfds_coco_under_mock_data(tmp_path):
    cfg = DataConfig(source="tfds", data_dir=str(tmp_path), train_samples=8, eval_samples=10, max_boxes=5,
                     shuffle_buffer=10)  # the default 10,000 would first fill with 1,000 copies of the 10 examples
    with mock_coco(10):
        src = make_source(cfg, MODEL)
        src.validate()
        assert src.category_map.category_ids == coco_category_ids()
        for el in take(src.train(ctx()), 12):
            check_element(el, S, 5, 80)
            assert set(el["labels"][el["labels"] > 0].tolist()) <= {1, 5, 80}
        assert len(list(src.eval_records().as_numpy_iterator())) == 10
        image = src.eval_parse(next(iter(src.eval_records())))["image"]
        assert image.shape == (S, S, 3)
        np.testing.assert_array_equal(src.eval_image_ids, np.arange(100, 110))
        assert (src.eval_image_sizes == S).all()
        gt = src.ground_truth()
        assert {a["category_id"] for a in gt.dataset["annotations"]} <= {1, 5, 90}
        assert len(gt.getImgIds()) == 10 and len(gt.getAnnIds()) > 0
        assert evaluate(gt, perfect_detections(gt)) == pytest.approx(1.0)
        a = gt.dataset["annotations"][0]
        assert a["area"] == pytest.approx(a["bbox"][2] * a["bbox"][3])


def test_tfds_bad_box_is_one_clear_error(tmp_path):
    cfg = DataConfig(source="tfds", data_dir=str(tmp_path), eval_samples=6)
    with mock_coco(6, bad_box=True), pytest.raises(HarnessError, match=r"image id 10\d has a box outside \[0, 1\]"):
        make_source(cfg, MODEL).validate()


# --------------------------------------------------------------------------------------------------- bad input

def write_records(tmp_path, val: list[tuple[int, list, list]], train: list[tuple[int, list, list]] | None = None,
                  json_ids: list[int] | None = None) -> dict:
    """Hand-made shards: each record is (image id, boxes ltrb, category ids); the json lists json_ids."""
    names = {1: "red_rectangle", 5: "green_ellipse", 9: "blue_triangle"}
    image = np.zeros((8, 8, 3), np.uint8)
    for prefix, rows in (("val", val), ("train", train or val)):
        with tf.io.TFRecordWriter(str(tmp_path / f"{prefix}-00000-of-00001.tfrecord")) as w:
            for image_id, boxes, cats in rows:
                w.write(tfrecord_writer.coco_example(image, image_id, np.asarray(boxes), cats, names))
    ids = json_ids if json_ids is not None else [r[0] for r in val]
    path = tmp_path / "instances_val.json"
    annotations = [{"id": k + 1, "image_id": i, "category_id": 1, "bbox": [1.0, 1.0, 2.0, 2.0], "area": 4.0,
                    "iscrowd": 0} for k, i in enumerate(ids)]
    path.write_text(json.dumps({"images": [{"id": i, "height": 8, "width": 8} for i in ids],
                                "annotations": annotations,
                                "categories": [{"id": c, "name": n} for c, n in names.items()]}))
    return {"val_json": str(path)}


GOOD = [(1, [[0.1, 0.1, 0.5, 0.5]], [1]), (2, [[0.2, 0.3, 0.9, 0.8]], [5])]


def test_bad_inputs_each_give_one_clear_error(tmp_path):
    def error(out: dict, **kw) -> str:
        with pytest.raises(HarnessError) as e:
            make_source(tfrecord_cfg(out, **{"eval_samples": 2, **kw}), MODEL).validate()
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "needs data.data_dir" in error({"val_json": "x.json"}, data_dir="")
    assert "does not exist" in error({"val_json": "x.json"}, data_dir=str(tmp_path / "nowhere"))
    (tmp_path / "good").mkdir()
    out = write_records(tmp_path / "good", GOOD)
    assert "no files match" in error(out, eval_pattern="eval-*")
    assert "annotation file not found" in error(out, annotation_file=str(tmp_path / "missing.json"))
    (tmp_path / "broken.json").write_text("{not json")
    assert "cannot read COCO annotation file" in error(out, annotation_file=str(tmp_path / "broken.json"))
    assert "eval_samples=3 but" in error(out, eval_samples=3)
    for name, change, words in (("noann", lambda d: d.update(annotations=[]), "has no annotations"),
                                ("nocats", lambda d: d.pop("categories"), "has no 'categories' list"),
                                ("noname", lambda d: d["categories"][0].pop("name"), "a category lacks name"),
                                ("nobbox", lambda d: d["annotations"][0].pop("bbox"), "an annotation lacks bbox")):
        data = json.loads(open(out["val_json"]).read())
        change(data)
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
        assert words in error(out, annotation_file=str(tmp_path / f"{name}.json"))

    def case(name: str, val, **kw) -> str:
        (tmp_path / name).mkdir()
        return error(write_records(tmp_path / name, val, **kw))

    msg = case("ids", GOOD, json_ids=[1, 3])
    assert "do not match the eval records" in msg and "1 record ids missing" in msg
    msg = case("outside", [GOOD[0], (2, [[0.2, 0.3, 1.2, 0.8]], [5])])
    assert BAD_BOX in msg and "val-00000-of-00001.tfrecord" in msg and "image id '2'" in msg
    assert BAD_BOX in case("flipped", [GOOD[0], (2, [[0.6, 0.3, 0.4, 0.8]], [5])])
    msg = case("unmapped", [GOOD[0], (2, [[0.2, 0.3, 0.9, 0.8]], [7])])
    assert UNMAPPED in msg and "7" in msg
    assert BAD_BOX in case("train_prefix", GOOD, train=[(3, [[-0.1, 0.3, 0.9, 0.8]], [5])])


def test_pipeline_assertion_guards_records_validate_did_not_read(tmp_path):
    out = write_records(tmp_path, GOOD, train=[(3, [[0.5, 0.3, 0.4, 0.8]], [5])])
    src = make_source(tfrecord_cfg(out, eval_samples=2), MODEL)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"has a box outside \[0, 1\]"):
        take(src.train(ctx()), 1)


def smooth_photo(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth colour gradients with hard-edged patches and grain: chroma that upsampling differences would show."""
    low = rng.uniform(0, 255, size=(height // 20 + 2, width // 20 + 2, 3)).astype(np.float32)
    image = tf.image.resize(low, [height, width], method="bicubic").numpy()
    for _ in range(5):
        y, x = rng.integers(0, height - 8), rng.integers(0, width - 8)
        image[y:y + rng.integers(4, height // 2), x:x + rng.integers(4, width // 2)] = rng.uniform(0, 255, size=3)
    return np.clip(image + rng.normal(0, 10, size=image.shape), 0, 255).astype(np.uint8)


def test_crop_window_decode_gives_the_pixels_of_the_whole_image():
    """`decode_window` (data.decode_crop_window) equals decoding the whole JPEG and slicing, bit for bit, for 4:2:0
    and 4:4:4 JPEGs of odd sizes and windows at odd offsets; the whole training transform on the encoded image
    equals it on the decoded one."""
    from benchmarks.ssd.data import decode_crop, decode_window, preprocess_train

    rng = np.random.default_rng(7)
    for height, width, quality, subsample in ((121, 157, 75, True), (96, 130, 92, False), (77, 61, 85, True)):
        jpeg = tf.io.encode_jpeg(smooth_photo(rng, height, width), quality=quality, chroma_downsampling=subsample)
        whole = tf.io.decode_jpeg(jpeg, channels=3).numpy()
        for _ in range(12):
            y0, x0 = int(rng.integers(0, height - 1)), int(rng.integers(0, width - 1))
            y1, x1 = int(rng.integers(y0 + 1, height + 1)), int(rng.integers(x0 + 1, width + 1))
            np.testing.assert_array_equal(decode_window(jpeg, y0, x0, y1, x1).numpy(), whole[y0:y1, x0:x1],
                                          err_msg=f"{height}x{width} q{quality} window {(y0, x0, y1, x1)}")
        boxes = tf.constant([[0.2, 0.3, 0.6, 0.7], [0.5, 0.1, 0.9, 0.4]])
        labels = tf.constant([1, 2])
        for s in range(6):
            seed = tf.constant([s, 1], tf.int64)
            a = preprocess_train(jpeg, boxes, labels, seed, S, 5, True, 1, jitter_on_device=True)
            b = preprocess_train(tf.constant(whole), boxes, labels, seed, S, 5, True, 1, jitter_on_device=True)
            for k in a:
                np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)
    png = tf.io.encode_png(smooth_photo(rng, 40, 50))  # not a JPEG: decoded whole, then sliced
    np.testing.assert_array_equal(decode_window(png, 3, 5, 20, 33).numpy(),
                                  tf.io.decode_png(png, channels=3).numpy()[3:20, 5:33])
    window = tf.constant([0.1, 0.075, 0.66, 0.5])  # ltrb: columns 5:33, rows 3:20 of 50x40
    np.testing.assert_array_equal(decode_crop(png, window).numpy(),
                                  tf.io.decode_png(png, channels=3).numpy()[3:20, 5:33])


def test_flip_on_device_and_scale_in_step_give_the_host_pipelines_images():
    """data.flip_on_device: the boxes flip on the host with the same coin, the images in the train step: the
    batch equals the host-flipped one to float rounding (the half-pixel bilinear resize commutes with the flip).
    data.scale_in_step: the 0..255 float32 pixels scaled in the step equal the host's float32 [0, 1] pixels."""
    base = dict(scale_in_step=False, images_in_compute_dtype=False, augment=True, jitter_on_device=True)
    variants = {"host": synthetic(**base, flip_on_device=False), "flip": synthetic(**base),
                "scale": synthetic(**{**base, "scale_in_step": True})}
    sources = {k: make_source(cfg, MODEL, tf.bfloat16) for k, cfg in variants.items()}
    assert sources["scale"].scales_in_step and sources["scale"].train_image_dtype == tf.float32
    els = {k: take(src.train(ctx()), 8) for k, src in sources.items()}
    assert "flip" not in els["host"][0] and "flip" in els["flip"][0] and "flip" in els["scale"][0]
    coins = [bool(el["flip"]) for el in els["flip"]]
    assert True in coins and False in coins
    images = {k: device_image({f: tf.constant(np.stack([el[f] for el in v])) for f in v[0]},
                              sources[k].scales_in_step).numpy() for k, v in els.items()}
    np.testing.assert_allclose(images["flip"], images["host"], atol=1e-5)
    np.testing.assert_allclose(images["scale"], images["flip"], atol=1e-5)
    for k in ("flip", "scale"):
        for a, b in zip(els[k], els["host"]):
            np.testing.assert_array_equal(a["boxes"], b["boxes"])
            np.testing.assert_array_equal(a["labels"], b["labels"])
            np.testing.assert_array_equal(a["jitter"], b["jitter"])
    unaugmented = make_source(synthetic(augment=False), MODEL, tf.bfloat16)
    assert not unaugmented.scales_in_step and unaugmented.train_image_dtype == tf.bfloat16
