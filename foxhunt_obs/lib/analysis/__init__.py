"""Pure maths over rows already in hand: prices and the cost estimate, training health, cost anomalies."""
