"""An independent solution of ps6-scaling: written from the release notebook's text alone."""
ANSWERS = {
    "fit_power_law": '''def fit_power_law(x, y):
    """Least squares in log space for y = a * x**b; returns (a, b) as floats."""
    u = np.log(np.asarray(x, dtype=float))
    v = np.log(np.asarray(y, dtype=float))
    design = np.stack([np.ones_like(u), u], axis=1)
    (log_a, b), *_ = np.linalg.lstsq(design, v, rcond=None)
    return float(np.exp(log_a)), float(b)
''',
    "training_flops": '''def training_flops(N, D):
    """C = 6 N D, for floats or broadcastable arrays."""
    return 6.0 * np.multiply(N, D)
''',
    "compute_optimal": '''def compute_optimal(C, E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28):
    """The (N_opt, D_opt) minimising chinchilla_loss subject to 6 N D = C.
    The balance alpha A / N**alpha = beta B / D**beta with D = C / (6 N) gives
    N**(alpha + beta) = alpha A / (beta B) * (C / 6)**beta."""
    C = np.asarray(C, dtype=float)
    N_opt = (alpha * A / (beta * B) * (C / 6.0) ** beta) ** (1.0 / (alpha + beta))
    D_opt = C / (6.0 * N_opt)
    if N_opt.ndim == 0:
        return float(N_opt), float(D_opt)
    return N_opt, D_opt
''',
    "chinchilla_objective": '''def chinchilla_objective(params, N, D, loss, delta=1e-3):
    """Sum of Huber_delta(log L(N_i, D_i) - log loss_i) over the runs, as a float."""
    predicted = (params["E"] + params["A"] / np.asarray(N, dtype=float) ** params["alpha"]
                 + params["B"] / np.asarray(D, dtype=float) ** params["beta"])
    r = np.abs(np.log(predicted) - np.log(np.asarray(loss, dtype=float)))
    return float(np.sum(np.where(r <= delta, 0.5 * r**2, delta * (r - 0.5 * delta))))
''',
    "chinchilla_fit": '''def chinchilla_fit(N, D, loss, delta=1e-3):
    """Fit E, A, B, alpha, beta by minimising the Huber objective of the log-loss; returns a dict of floats."""
    N, D, loss = (np.asarray(a, dtype=float) for a in (N, D, loss))
    log_loss = np.log(loss)
    mu_n, mu_d = np.log(N).mean(), np.log(D).mean()
    u, w = np.log(N) - mu_n, np.log(D) - mu_d

    def huber(r):
        size = np.abs(r)
        return float(np.sum(np.where(size <= delta, 0.5 * r**2, delta * (size - 0.5 * delta))))

    def residuals_and_jacobian(theta):
        """theta = (a_c, b_c, e, alpha, beta) -> residuals log L_hat - log L and their Jacobian (n, 5)."""
        a_c, b_c, e, alpha, beta = theta
        z = np.stack([a_c - alpha * u, b_c - beta * w, np.full_like(u, e)], axis=1)
        top = z.max(axis=1, keepdims=True)
        weights = np.exp(z - top)
        total = weights.sum(axis=1, keepdims=True)
        weights /= total
        r = (top + np.log(total))[:, 0] - log_loss
        jac = np.stack([weights[:, 0], weights[:, 1], weights[:, 2], -weights[:, 0] * u, -weights[:, 1] * w], axis=1)
        return r, jac

    def refine(theta, iterations=3000):
        """Levenberg-Marquardt on the Huber objective, with iteratively reweighted least-squares curvature."""
        r, jac = residuals_and_jacobian(theta)
        value, damping = huber(r), 1e-3
        for _ in range(iterations):
            size = np.abs(r)
            weight = np.where(size <= delta, 1.0, delta / np.maximum(size, delta))
            gradient = jac.T @ np.clip(r, -delta, delta)
            curvature = jac.T @ (weight[:, None] * jac)
            step = np.linalg.solve(curvature + damping * np.diag(np.diag(curvature) + 1e-12), -gradient)
            r_new, jac_new = residuals_and_jacobian(theta + step)
            new_value = huber(r_new)
            if new_value <= value:
                converged = value - new_value <= 1e-15 * max(value, 1e-300) and np.abs(step).max() < 1e-10
                theta, r, jac, value = theta + step, r_new, jac_new, new_value
                damping = max(damping / 3, 1e-12)
                if converged:
                    break
            else:
                damping *= 3
                if damping > 1e12:
                    break
        return theta, value

    # starting points: for each (alpha, beta) on a grid, (E, A, B) by linear least squares on the losses
    starts = []
    for alpha in np.linspace(0.05, 1.0, 20):
        for beta in np.linspace(0.05, 1.0, 20):
            columns = np.stack([np.ones_like(N), N**-alpha, D**-beta], axis=1)
            E, A, B = np.maximum(np.linalg.lstsq(columns, loss, rcond=None)[0], 1e-6)
            theta = np.array([np.log(A) - alpha * mu_n, np.log(B) - beta * mu_d, np.log(E), alpha, beta])
            starts.append((huber(residuals_and_jacobian(theta)[0]), tuple(theta)))
    starts.sort()
    best_theta, best_value = None, np.inf
    for _, theta in starts[:8]:
        theta, value = refine(np.array(theta))
        if value < best_value:
            best_theta, best_value = theta, value
    a_c, b_c, e, alpha, beta = best_theta
    return {"E": float(np.exp(e)), "A": float(np.exp(a_c + alpha * mu_n)), "B": float(np.exp(b_c + beta * mu_d)),
            "alpha": float(alpha), "beta": float(beta)}
''',
}
