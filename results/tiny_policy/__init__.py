"""The tiny pretrained policies (ckpt05, ckpt30, ckpt60) and sft_tiny.py, which makes them."""
