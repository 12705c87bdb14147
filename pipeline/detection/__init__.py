"""Face detectors (Haar, MTCNN, dlib HOG) and their box calibration against annotated boxes."""
