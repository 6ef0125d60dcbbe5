"""Media as bytes and files: `audio_io` (read, resample, write WAV), `image_io` (RGB arrays, PNG,
sizes), `limits` (the media bounds a stage and a client check before decoding). No torch import."""
