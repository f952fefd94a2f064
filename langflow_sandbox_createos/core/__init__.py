"""What the three surfaces share: settings, the control-plane endpoint and its errors, network
rules, guest shapes, the warm pool and its keeper, admission control and time helpers."""
