#![doc = "model"]
