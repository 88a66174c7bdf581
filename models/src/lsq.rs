//! A small dense linear least-squares solver for the calibration (a handful of columns).
//!
//! Columns are scaled to unit norm (the regressors differ by twelve orders of magnitude:
//! FLOP-derived nanoseconds next to an intercept of ones), then factored by modified
//! Gram-Schmidt with one re-orthogonalisation pass, which is as accurate as Householder
//! QR for so few columns and far better conditioned than the normal equations. A column
//! that is (nearly) a combination of the earlier ones is reported, not solved through.

/// Below this norm, relative to its scaled length of 1, a column left after removing the
/// earlier ones carries no independent information (less than a 1e-7 relative spread).
const DEGENERATE: f64 = 1e-7;

/// Why a least-squares problem has no unique solution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Singular {
    /// Column `j` is all zeros.
    Zero(usize),
    /// Column `j` is (nearly) a linear combination of the columns before it.
    Dependent(usize),
}

/// Minimise `|| sum_j cols[j] * x[j] - y ||^2`; every column has `y.len()` rows.
pub(crate) fn solve(cols: &[Vec<f64>], y: &[f64]) -> Result<Vec<f64>, Singular> {
    let p = cols.len();
    let mut q: Vec<Vec<f64>> = Vec::with_capacity(p);
    let mut scale = Vec::with_capacity(p);
    let mut r = vec![vec![0.0; p]; p];
    for (j, col) in cols.iter().enumerate() {
        let norm = dot(col, col).sqrt();
        if norm == 0.0 || !norm.is_finite() {
            return Err(Singular::Zero(j));
        }
        let mut v: Vec<f64> = col.iter().map(|x| x / norm).collect();
        for _pass in 0..2 {
            for (k, qk) in q.iter().enumerate() {
                let c = dot(qk, &v);
                r[k][j] += c;
                for (vi, qi) in v.iter_mut().zip(qk) {
                    *vi -= c * qi;
                }
            }
        }
        let left = dot(&v, &v).sqrt();
        if left < DEGENERATE {
            return Err(Singular::Dependent(j));
        }
        r[j][j] = left;
        for vi in &mut v {
            *vi /= left;
        }
        q.push(v);
        scale.push(norm);
    }
    // R x' = Q^T y, then undo the column scaling.
    let z: Vec<f64> = q.iter().map(|qj| dot(qj, y)).collect();
    let mut x = vec![0.0; p];
    for j in (0..p).rev() {
        let mut s = z[j];
        for k in j + 1..p {
            s -= r[j][k] * x[k];
        }
        x[j] = s / r[j][j];
    }
    for (xj, s) in x.iter_mut().zip(&scale) {
        *xj /= s;
    }
    Ok(x)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_line_is_recovered() {
        let x: Vec<f64> = (1..=5).map(|i| f64::from(i) * 1e12).collect();
        let y: Vec<f64> = x.iter().map(|v| 3e-12 * v + 7.0).collect();
        let sol = solve(&[x, vec![1.0; 5]], &y).unwrap();
        assert!((sol[0] - 3e-12).abs() < 1e-24, "{sol:?}");
        assert!((sol[1] - 7.0).abs() < 1e-6, "{sol:?}");
    }

    #[test]
    fn overdetermined_fit_is_least_squares() {
        // Four points off any line: slope and intercept are the textbook 8/5 and 8/5.
        let x = vec![0.0, 1.0, 2.0, 3.0];
        let y = vec![2.0, 2.0, 6.0, 6.0];
        let sol = solve(&[x, vec![1.0; 4]], &y).unwrap();
        assert!(
            (sol[0] - 1.6).abs() < 1e-12 && (sol[1] - 1.6).abs() < 1e-12,
            "{sol:?}"
        );
    }

    #[test]
    fn constant_regressor_is_dependent_on_intercept() {
        let x = vec![5e11; 4];
        let y = vec![1.0, 2.0, 3.0, 4.0];
        assert_eq!(solve(&[x, vec![1.0; 4]], &y), Err(Singular::Dependent(1)));
    }

    #[test]
    fn zero_column_is_reported() {
        assert_eq!(
            solve(&[vec![0.0; 3], vec![1.0; 3]], &[1.0, 2.0, 3.0]),
            Err(Singular::Zero(0))
        );
    }
}
