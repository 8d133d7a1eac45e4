"""What the proxy shows of itself: Prometheus metrics, the request timing behind them, and its log format."""
