"""The face tracker: boxes from keypoints, stable ids, lost and closed tracks."""


from pathlib import Path

import numpy as np
import pytest

from pipeline.detection.haar import cascade_available
from pipeline.inference.tracking import (
    FaceTracker,
    measure_points_to_box,
    points_to_box,
    unscored,
    visible_fraction,
)
from pipeline.synth.face import TEMPLATE

needs_haar = pytest.mark.skipif(not cascade_available(), reason="this OpenCV has no Haar cascade (OpenCV 5)")
C = {"w_scale": 1.0, "h_scale": 1.12, "dx": 0.0, "dy": -0.06}
HAAR = ["--set", "video.detector=haar"]  # the test video's face was chosen for it; the others are optional


def test_points_to_box_is_the_stated_mapping_and_measure_inverts_it(face_points, make_dataset):
    p = face_points  # x extent 40..120, y extent 40..130
    box = points_to_box(p, C)[0]
    w, h = 80.0, 90.0
    np.testing.assert_allclose(box, [80 - w / 2, 85 - 0.06 * h - 1.12 * h / 2, w, 1.12 * h])
    # an XML whose boxes are exactly points_to_box of its keypoints gives back the constants
    c = {"w_scale": 0.9, "h_scale": 1.2, "dx": 0.05, "dy": -0.1}
    entries = []
    for j, s in enumerate((1.0, 1.5, 0.7)):
        kp = p * s + j * 3
        b = points_to_box(kp, c)[0]
        entries.append((f"{j}.png", [(tuple(f"{v:.6f}" for v in b), kp)]))
    root = make_dataset(images={f"{j}.png": np.zeros((300, 300, 3), np.uint8) for j in range(3)}, train=entries)
    got = measure_points_to_box(root / "labels_ibug_300W_train.xml")
    assert got["faces"] == 3
    for k, v in c.items():
        assert got[k] == pytest.approx(v, abs=1e-3), k


def test_visible_fraction():
    assert visible_fraction(np.array([10, 10, 20, 20]), 100, 100) == 1.0
    assert visible_fraction(np.array([-10, 0, 20, 20]), 100, 100) == 0.5
    assert visible_fraction(np.array([200, 0, 20, 20]), 100, 100) == 0.0


class Scene:
    """Faces as point sets moving in a 200 x 160 picture; the detector returns the true boxes
    (points_to_box of the truth, largest first) except on the frames and faces listed in
    `hide`; the predictor returns, for each box, the truth of the face nearest to its centre
    (so the tracked box of the next frame is exactly points_to_box of this frame's truth)."""

    W, H = 200, 160

    def __init__(self, tpl, paths, hide=()):
        self.tpl, self.paths, self.hide = tpl, paths, set(hide)
        self.frame, self.detect_calls, self.boxes_seen = 0, [], []

    def truth(self, i):
        out = {}
        for name, path in self.paths.items():
            at = path(i)
            if at is not None:
                out[name] = self.tpl * at[2] + np.array(at[:2])
        return out

    def detect(self, image):
        self.detect_calls.append(self.frame)
        t = {k: v for k, v in self.truth(self.frame).items() if (self.frame, k) not in self.hide}
        boxes = [points_to_box(p, C)[0] for p in t.values()]
        boxes = [b for b in boxes if visible_fraction(b, self.W, self.H) >= 0.5]
        return np.array(sorted(boxes, key=lambda b: -b[2] * b[3])).reshape(-1, 4)

    def predict(self, image, boxes):
        self.boxes_seen.append((self.frame, np.array(boxes)))
        t = list(self.truth(self.frame).values())
        centres = np.array([points_to_box(p, C)[0][:2] + points_to_box(p, C)[0][2:] / 2 for p in t])
        out = []
        for b in boxes:
            j = int(np.argmin(np.linalg.norm(centres - (b[:2] + b[2:] / 2), axis=1)))
            out.append(t[j])
        return np.stack(out)

    def run(self, n, **kw):
        predict = self.predict if isinstance(self, ScoredScene) else unscored(self.predict)
        tracker = FaceTracker(self.detect, predict, box_from_points=C, **kw)
        image = np.zeros((self.H, self.W, 3), np.uint8)
        per_frame = []
        for i in range(n):
            self.frame = i
            per_frame.append({tr.id: tr.points.copy() for tr in tracker.step(i, i / 25, image)})
        tracker.close_all()
        return tracker, per_frame


@pytest.fixture
def tpl():
    p = TEMPLATE[:, :2]
    return (p - p.min(0)) / (p.max(0) - p.min(0)) * [30, 34]  # a 30 x 34 px face at the origin


def test_tracker_ids_stay_stable_and_a_face_that_leaves_is_closed(tpl):
    paths = {
        "a": lambda i: (20 + 2 * i, 40 + i, 1.0),  # drifts right and down, stays in the picture
        "b": lambda i: (120 + 6 * i, 90, 1.2),  # leaves through the right edge (frame 10)
        "c": lambda i: (60, 100, 1.1) if i >= 14 else None,  # appears at frame 14
    }
    scene = Scene(tpl, paths)
    tracker, frames = scene.run(24, detect_every=5, retry_every=3)
    by_id = {t.id: t for t in tracker.closed}
    assert sorted(by_id) == [0, 1, 2]  # no id reused
    b_id, a_id, c_id = 0, 1, 2  # the detector lists the larger face (b) first
    for i, f in enumerate(frames):  # a keeps its id on every frame, with exact keypoints
        assert np.allclose(f[a_id], scene.truth(i)["a"])
    # b's box on frame i comes from frame i - 1's keypoints, less than half inside from i = 12
    assert visible_fraction(points_to_box(scene.truth(11)["b"], C)[0], 200, 160) < 0.5
    assert visible_fraction(points_to_box(scene.truth(10)["b"], C)[0], 200, 160) >= 0.5
    assert all(np.allclose(frames[i][b_id], scene.truth(i)["b"]) for i in range(12))
    assert not any(b_id in frames[i] for i in range(12, 24))
    assert by_id[b_id].end == "left the picture" and by_id[b_id].last_frame == 11
    # the detector: frame 0, every 5 frames, when b left (12) as soon as retry_every (3)
    # frames have passed since the last run (13), then every 5 again; c, in the picture from
    # 14, is found on the next detection frame
    assert scene.detect_calls == [0, 5, 10, 13, 18, 23]
    assert by_id[c_id].first_frame == 18 and all(c_id in frames[i] for i in range(18, 24))
    assert by_id[a_id].end == by_id[c_id].end == "end of video"


def test_tracked_box_is_exactly_the_box_of_the_last_keypoints(tpl):
    scene = Scene(tpl, {"a": lambda i: (30 + 3 * i, 40 + 2 * i, 1.0 + 0.02 * i)})
    scene.run(8, detect_every=100)
    assert [f for f, _ in scene.boxes_seen] == list(range(8))
    assert scene.detect_calls == [0]
    for f, boxes in scene.boxes_seen[1:]:
        np.testing.assert_allclose(boxes[0], points_to_box(scene.truth(f - 1)["a"], C)[0], atol=1e-9)


def test_tracker_closes_a_track_the_detector_keeps_missing(tpl):
    hide = {(i, "a") for i in range(4, 30)}  # detector stops seeing a from frame 4
    scene = Scene(tpl, {"a": lambda i: (30, 40, 1.0)}, hide)
    tracker, frames = scene.run(12, detect_every=2, max_missed=1)
    (t,) = tracker.closed
    # missed on frames 4 and 6: closed on 6 (more than max_missed=1 in a row), then the
    # detector runs on every frame (nothing tracked) and finds nothing
    assert t.end == "not detected" and t.last_frame == 5
    assert all(0 in frames[i] for i in range(6)) and not any(frames[i] for i in range(6, 12))


def test_a_lost_track_is_found_again_under_its_id(tpl):
    # a predictor whose keypoints on frame 3 collapse (the keypoints left the face): the
    # tracker detects on frame 3 itself (the same-frame search) and continues the same track
    # from the detector's box; frame 3's keypoints collapse again there, so the track starts
    # frame 4 lost, and the detector owes it the run retry_every frames later (6)
    scene = Scene(tpl, {"a": lambda i: (30 + i, 40, 1.0)})
    predict = scene.predict

    def bad_on_3(image, boxes):
        p = predict(image, boxes)
        return p * 0.1 + 5 if scene.frame == 3 else p

    scene.predict = bad_on_3
    tracker, frames = scene.run(8, detect_every=100, retry_every=3)
    assert scene.detect_calls == [0, 3, 6]
    assert [list(f) for f in frames] == [[0]] * 8
    assert tracker.closed[0].end == "end of video"


def test_a_detection_of_the_same_face_at_another_scale_never_starts_a_second_track(tpl):
    # the detector returns the face twice: its box and a box of 0.6 its side around the face's
    # centre (a Haar-style second hit on the same face at another scale: IoU 0.36 only)
    scene = Scene(tpl, {"a": lambda i: (40 + i, 50, 2.0)})
    detect = scene.detect

    def twice(image):
        boxes = detect(image)
        inner = boxes[:, :2] + 0.2 * boxes[:, 2:]
        return np.concatenate([boxes, np.concatenate([inner, 0.6 * boxes[:, 2:]], axis=1)])

    scene.detect = twice
    tracker, frames = scene.run(12, detect_every=2)
    assert [t.id for t in tracker.closed] == [0]
    assert all(list(f) == [0] for f in frames)


def test_a_face_the_model_keeps_losing_costs_a_bounded_number_of_detector_runs(tpl):
    # a predictor whose keypoints always collapse: the track is lost on every frame, and the
    # detector (which finds the face every time) runs at most once every retry_every frames
    scene = Scene(tpl, {"a": lambda i: (30, 40, 1.0)})
    predict = scene.predict
    scene.predict = lambda image, boxes: predict(image, boxes) * 0.1 + 5
    tracker, frames = scene.run(30, detect_every=10, retry_every=4)
    gaps = np.diff(scene.detect_calls)
    assert len(scene.detect_calls) >= 5 and gaps.min() >= 4  # 30 frames: 0, 4, 8, ... at most
    assert all(frames)  # a lost track keeps its last good box and its id in between
    assert {t.id for t in tracker.closed} == {0}


def test_an_empty_picture_runs_the_detector_every_retry_every_frames(tpl):
    scene = Scene(tpl, {"a": lambda i: (30, 40, 1.0) if i >= 7 else None})
    _, frames = scene.run(12, detect_every=10, retry_every=3)
    assert scene.detect_calls == [0, 3, 6, 9]
    assert not any(frames[i] for i in range(9)) and all(0 in frames[i] for i in range(9, 12))


def test_a_detection_of_the_tracked_face_at_another_scale_keeps_the_track_alive(tpl):
    # the detector finds the face on frame 0, then only as a box of half its side around the
    # face's centre (IoU 0.25 with the tracked box: below match_iou, but inside it). The track's
    # keypoints are exact throughout: those detections are its face, not misses, so it must not
    # close as undetected (with max_missed 1, on frame 4) and be restarted under a new id
    scene = Scene(tpl, {"a": lambda i: (40 + i, 50, 2.0)})
    detect = scene.detect

    def smaller_after_0(image):
        boxes = detect(image)
        if scene.frame == 0:
            return boxes
        return np.concatenate([boxes[:, :2] + 0.25 * boxes[:, 2:], 0.5 * boxes[:, 2:]], axis=1)

    scene.detect = smaller_after_0
    tracker, frames = scene.run(12, detect_every=2, max_missed=1)
    assert scene.detect_calls == [0, 2, 4, 6, 8, 10]  # found each time: no retries
    assert [t.id for t in tracker.closed] == [0] and tracker.closed[0].end == "end of video"
    assert all(list(f) == [0] for f in frames)
    # disagreeing below IoU 0.5, the detector's box takes over, as for an IoU match
    for f, boxes in scene.boxes_seen:
        inner = points_to_box(scene.truth(f)["a"], C)[0]
        inner = np.concatenate([inner[:2] + 0.25 * inner[2:], 0.5 * inner[2:]])
        assert np.allclose(boxes[0], inner) == (f in (2, 4, 6, 8, 10)), f



def test_a_small_detection_inside_a_tracks_box_does_not_replace_it(tpl):
    # the detector finds the face on frame 0, then only a box of 0.15 its side at the face's
    # centre (a false hit on a part of the face: all of it inside the track's box, IoU 0.02).
    # The track keeps its id and its box from the keypoints: a box that small is no
    # re-anchoring of the face, it would shrink the track to it until the next detector run
    scene = Scene(tpl, {"a": lambda i: (40 + i, 50, 2.0)})
    detect = scene.detect

    def small_after_0(image):
        boxes = detect(image)
        if scene.frame == 0:
            return boxes
        return np.concatenate([boxes[:, :2] + 0.425 * boxes[:, 2:], 0.15 * boxes[:, 2:]], axis=1)

    scene.detect = small_after_0
    tracker, frames = scene.run(12, detect_every=2, max_missed=1)
    assert scene.detect_calls == [0, 2, 4, 6, 8, 10]
    assert [t.id for t in tracker.closed] == [0] and all(list(f) == [0] for f in frames)
    for f, boxes in scene.boxes_seen[1:]:  # every frame's box is the last keypoints' box
        np.testing.assert_allclose(boxes[0], points_to_box(scene.truth(f - 1)["a"], C)[0], atol=1e-9)


class ScoredScene(Scene):
    """A Scene whose predictor also scores its faces, as the model's face-presence score does:
    0.95 on a face (a box centred within a quarter of its side of a face's box centre), 0.1
    elsewhere (its points then are the template placed in the box) and on the frames and
    faces listed in `low` (a face the model stops recognising). `walls(i)`: boxes the
    detector also returns on frame i (false detections in the background), largest first."""

    def __init__(self, tpl, paths, hide=(), walls=lambda i: [], low=()):
        super().__init__(tpl, paths, hide)
        self.walls, self.low = walls, set(low)

    def detect(self, image):
        boxes = [*super().detect(image), *self.walls(self.frame)]
        return np.array(sorted(boxes, key=lambda b: -b[2] * b[3])).reshape(-1, 4)

    def predict(self, image, boxes):
        self.boxes_seen.append((self.frame, np.array(boxes)))
        faces = {name: (p, points_to_box(p, C)[0]) for name, p in self.truth(self.frame).items()}
        points, scores = [], []
        for b in boxes:
            near = [name for name, (_, fb) in faces.items()
                    if np.linalg.norm(fb[:2] + fb[2:] / 2 - b[:2] - b[2:] / 2) < 0.25 * max(b[2], b[3])]
            if near:
                points.append(faces[near[0]][0])
                scores.append(0.1 if (self.frame, near[0]) in self.low else 0.95)
            else:
                points.append(shape_in_box(b, C))
                scores.append(0.1)
        return np.stack(points), np.array(scores)


WALL = np.array([120.0, 20, 60, 60])  # larger than the face: the detector lists it first


def test_a_false_detection_that_scores_low_never_starts_a_track(tpl):
    scene = ScoredScene(tpl, {"a": lambda i: (20 + i, 80, 1.0)}, walls=lambda i: [WALL])
    tracker, frames = scene.run(20, detect_every=5, threshold=0.5, max_faces=1)
    # one face, one id, on every frame: the wall took neither an id nor max_faces' one place
    assert all(list(f) == [0] for f in frames) and [t.id for t in tracker.closed] == [0]
    assert tracker.rejected == len(scene.detect_calls) == 4 and tracker.next_id == 1
    # without the gate the wall is a track of its own, and with max_faces 1 it takes the place
    tracker, frames = ScoredScene(tpl, {"a": lambda i: (20 + i, 80, 1.0)}, walls=lambda i: [WALL]).run(
        20, detect_every=5, max_faces=1)
    assert [t.id for t in tracker.closed] == [0] and tracker.rejected == 0
    assert all(np.allclose(f[0], shape_in_box(WALL, C)) for f in frames)


def test_a_face_that_scores_low_is_hidden_and_the_detector_has_a_fresh_look(tpl):
    # a low score on frame 5 only: the detector looks at frame 5 itself (the same-frame
    # search: has the face moved?), finds it where it was, the face still scores low there, so
    # it is hidden on 5; it scores well again on 6 and the same id goes on; the detector owes
    # the hidden track a fresh look, retry_every frames after its last run (8)
    scene = ScoredScene(tpl, {"a": lambda i: (30 + i, 40, 1.0)}, low={(5, "a")})
    tracker, frames = scene.run(12, detect_every=100, retry_every=3, threshold=0.5)
    assert scene.detect_calls == [0, 5, 8]
    assert [list(f) for f in frames] == [[0]] * 5 + [[]] + [[0]] * 6
    assert [t.id for t in tracker.closed] == [0] and tracker.closed[0].end == "end of video"
    # low from frame 5 on: still low after the detector's fresh look on frame 8, so closed
    # there; then nothing is tracked, and the detector's candidates are no faces
    scene = ScoredScene(tpl, {"a": lambda i: (30 + i, 40, 1.0)}, low={(i, "a") for i in range(5, 12)})
    tracker, frames = scene.run(12, detect_every=100, retry_every=3, threshold=0.5)
    assert [list(f) for f in frames] == [[0]] * 5 + [[]] * 7
    (t,) = tracker.closed
    assert t.end.startswith("not a face") and t.last_frame == 4
    assert scene.detect_calls == [0, 5, 8, 11] and tracker.rejected == 1  # frame 11's detection of a


def fast_turn(i):
    """A face that drifts, then jumps 1.2 of its width per frame on frames 5-7 (a fast head
    turn at 25 fps: the box from the last keypoints no longer holds the face), then drifts."""
    return (20 + i + 36 * min(max(i - 4, 0), 3), 60, 1.0)


@pytest.mark.parametrize("gate", [None, 0.5], ids=["keypoints", "presence"])
def test_a_fast_head_turn_keeps_one_id_on_every_frame(tpl, gate):
    # keypoints: the predictor finds the face from any box, so the keypoints' box jumps away
    # from the track's (lost by IoU); presence: from a box off the face it gives a template in
    # the box and a low score. Either way the tracker searches the same frame, finds the face
    # within REFIND_REACH of the track and continues it: one id, the true keypoints, every frame
    scene = (Scene if gate is None else ScoredScene)(tpl, {"a": fast_turn})
    tracker, frames = scene.run(12, detect_every=100, retry_every=5, threshold=gate)
    assert [list(f) for f in frames] == [[0]] * 12 and [t.id for t in tracker.closed] == [0]
    for i, f in enumerate(frames):
        np.testing.assert_allclose(f[0], scene.truth(i)["a"], err_msg=f"frame {i}")
    assert scene.detect_calls == [0, 5, 6, 7]  # one search per jump, none in between


def test_a_face_lost_in_a_fast_turn_and_found_again_nearby_keeps_its_id(tpl):
    # the detector misses the face on the frame it jumps (5): the track closes as lost; the
    # detector's next run (retry_every later) finds it near where it was lost: the same id
    paths = {"a": lambda i: (20 + i + (40 if i >= 5 else 0), 60, 1.0)}
    scene = ScoredScene(tpl, paths, hide={(5, "a")})
    tracker, frames = scene.run(12, detect_every=100, retry_every=3, threshold=0.5)
    assert scene.detect_calls == [0, 5, 8]
    assert [list(f) for f in frames] == [[0]] * 5 + [[]] * 3 + [[0]] * 4
    (t,) = tracker.closed
    assert (t.id, t.first_frame, t.end, tracker.next_id) == (0, 0, "end of video", 1)
    # found two detector runs after the frame it was lost on (5: runs on 8 and 11): the same id
    scene = ScoredScene(tpl, paths, hide={(5, "a"), (8, "a")})
    tracker, frames = scene.run(14, detect_every=100, retry_every=3, threshold=0.5)
    assert scene.detect_calls == [0, 5, 8, 11]
    assert [list(f) for f in frames] == [[0]] * 5 + [[]] * 6 + [[0]] * 3 and tracker.next_id == 1
    # a face found far from where the track was lost is another face: a new id
    far = {"a": lambda i: (20 + i + (120 if i >= 5 else 0), 60, 1.0)}
    tracker, frames = ScoredScene(tpl, far, hide={(5, "a")}).run(12, detect_every=100, retry_every=3, threshold=0.5)
    assert [list(f) for f in frames][8:] == [[1]] * 4 and [t.id for t in tracker.closed] == [0, 1]


class DimScene(ScoredScene):
    """A ScoredScene whose face scores `dim` instead of 0.1 on the frames listed in `low`:
    a face the model still recognises, less surely (a turn, motion blur)."""

    def __init__(self, tpl, paths, low, dim):
        super().__init__(tpl, paths, low=low)
        self.dim = dim

    def predict(self, image, boxes):
        points, scores = super().predict(image, boxes)
        return points, np.where(scores < 0.5, self.dim, scores)


def test_a_track_is_kept_down_to_the_keep_threshold_but_started_only_at_the_start_threshold(tpl):
    path = {"a": lambda i: (30 + i, 40, 1.0)}
    # the tracked face scores 0.6 on frames 5-8: under the start threshold, over the keep one
    dim = {(i, "a") for i in range(5, 9)}
    tracker, frames = DimScene(tpl, path, dim, 0.6).run(12, detect_every=100, retry_every=3, threshold=0.8,
                                                        keep_threshold=0.5)
    assert [list(f) for f in frames] == [[0]] * 12 and [t.id for t in tracker.closed] == [0]
    # one threshold for both (no keep_threshold): the same face is hidden on those frames
    tracker, frames = DimScene(tpl, path, dim, 0.6).run(12, detect_every=100, retry_every=3, threshold=0.8)
    assert [list(f) for f in frames][5] == []
    # a face first seen at 0.6 starts no track: the detector's candidates on frames 0 and 3
    # are rejected, the one on frame 6 (scoring 0.95) starts the track
    scene = DimScene(tpl, path, {(i, "a") for i in range(6)}, 0.6)
    tracker, frames = scene.run(12, detect_every=100, retry_every=3, threshold=0.8, keep_threshold=0.5)
    assert scene.detect_calls == [0, 3, 6] and tracker.rejected == 2
    assert [list(f) for f in frames] == [[]] * 6 + [[0]] * 6


REAL_VIDEO = Path(__file__).resolve().parents[3] / "shared" / "data" / "real-video"


def shape_in_box(box: np.ndarray, c: dict) -> np.ndarray:
    """The template's 68 points placed so that points_to_box(points, c) is `box` again: a
    stand-in model whose boxes neither drift nor jump, so the test sees the tracker alone."""
    x, y, w, h = box
    ew, eh = w / c["w_scale"], h / c["h_scale"]
    cx, cy = x + w / 2 - c["dx"] * ew, y + h / 2 - c["dy"] * eh
    pts = TEMPLATE[:, :2]
    unit = (pts - pts.min(0)) / (pts.max(0) - pts.min(0)) - 0.5  # extent centred on 0, side 1
    return unit * [ew, eh] + [cx, cy]


@needs_haar
@pytest.mark.realdata
@pytest.mark.parametrize("clip", ["d3.mp4", "d6.mp4"])
def test_a_real_talking_head_clip_is_one_track_with_bounded_detector_runs(clip):
    """Real footage of one person (../shared/data/real-video): one track and id for the whole
    clip under OpenCV's Haar detector, and the detector on at most one frame in detect_every
    plus one in retry_every (counted, not timed), never on every frame."""
    from pipeline.detection.detectors import get_detector
    from pipeline.formats.video import frames_of, open_video

    path = REAL_VIDEO / clip
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    found = get_detector("haar")
    tracker = FaceTracker(lambda image: found(image, 0)[0],
                          unscored(lambda image, boxes: np.stack([shape_in_box(b, C) for b in boxes])),
                          box_from_points=C, detect_every=10, retry_every=5)
    cap, fps, _ = open_video(path)
    n, ids = 0, set()
    try:
        for i, frame in enumerate(frames_of(cap)):
            ids.update(t.id for t in tracker.step(i, i / fps, frame))
            n = i + 1
    finally:
        cap.release()
    tracker.close_all()
    assert n > 300 and ids == {0}, (n, ids)
    assert len(tracker.closed) == 1
    assert tracker.detections <= n // 10 + n // 5 + 2
