"""`pipeline bench`, one module per section (command.py runs them all): training throughput, compute efficiency, inference speed and accuracy,
all measured in one run on one device, printed as a fixed-width table and written as JSON.

Sections (each figure lands in the JSON under the same names):

* train/<preset>: images/s of full training steps (forward, loss, backward, optimizer
  step) on the setup `pipeline train` builds (`build_training`, `train_steps`),
  fed by its real data path (`make_epoch_loader`: face cache -> FaceDataset with
  TrainAugment -> DataLoader -> DeviceLoader's producer thread) and by a synthetic batch
  already on the device; `data_overhead` = 1 - real / synthetic (goal <= 5%);
  `data_wait_frac_real` = the share of the real rounds' time spent waiting for a batch (what
  the trainer logs as "data wait").
* train_side_by_side (`--side-by-side N`, CPU): the first preset's real-feed steps in N
  processes at once, each pinned to its share of the CPUs with as many threads, as `pipeline
  train-folds` trains the folds; their summed images/s and the ratio to the one-process row.
* efficiency: training FLOPs per image (3 x the forward FLOPs of `model_flops`: forward +
  backward ~ 3 forwards) x images/s, over the fp32 matmul peak measured in the same run
  (torch.matmul of 2048x2048 fp32, best of a few reps; on CUDA bf16 too).
* infer/<preset>: faces/s of `predict_crops` (uint8 crops -> coordinates) with and without
  flip TTA, batch 1 and batched, with the default thread count and with 1 thread.
* batch1: one face at a time on one core, the first checkpoint through every inference
  backend (eager torch, the torch backend, onnxruntime fp32 and int8) beside dlib's
  predictor on the same crops (its box: the square each crop was cut around), in
  alternating rounds (`bench_batch1`).
* video: frames/s end to end (decode, detect, predict, draw, encode) and keypoint jitter and
  NME, raw vs smoothed (video.filter), on make-test-video's still and moving faces, for the batch-1
  model (`bench_video`).
* detectors (data set with a test XML): recall / unmatched detections per photo / photos/s
  of every installed face detector (`bench_detectors`, pipeline/detection/detectors.py).
* accuracy (data set with a solution.csv): MAE / NME / faces/s of the given checkpoints
  (exported .onnx models too),
  of the mean-shape-in-box baseline (mean training shape in box-normalised coordinates,
  placed into each test box) and of dlib's 68-point shape predictor when installed
  (`pip install 'pipeline[dlib]'`), all on the test XML's boxes as given (each row's
  `boxes` says how it used them; dlib gets each box as the rectangle it stands for).

Timings on a shared machine are noisy: real and synthetic steps are measured in
alternating rounds and the best round of each is kept, so their ratio is taken under the
same load."""
