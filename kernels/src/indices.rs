//! Integer index operands (token ids, class targets, positions): read and range-checked in one
//! place, whichever of i32 or i64 holds them.

use kiln_ir::DType;

use crate::error::{Error, Result};
use crate::view::TensorView;

/// An integer index operand (token ids, targets, positions): i32 or i64 elements, read as i64.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Indices<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl<'a> Indices<'a> {
    /// The elements of a contiguous i32 or i64 view. Any other dtype is [`Error::DType`] naming
    /// `operand` with i64 as the expected dtype (the error can name only one; i32 is accepted
    /// too); a non-contiguous view is [`Error::NotContiguous`].
    pub(crate) fn of(
        op: &'static str,
        operand: &'static str,
        view: &TensorView<'a>,
    ) -> Result<Self> {
        match view.dtype() {
            DType::I32 => Ok(Indices::I32(view.slice(op, operand)?)),
            // For every dtype but i64 this is the DType error naming `operand`.
            _ => Ok(Indices::I64(view.slice(op, operand)?)),
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Indices::I32(s) => s.len(),
            Indices::I64(s) => s.len(),
        }
    }

    /// The element at flat index `at`, as i64. Panics if `at >= self.len()`.
    pub(crate) fn get(&self, at: usize) -> i64 {
        match self {
            Indices::I32(s) => i64::from(s[at]),
            Indices::I64(s) => s[at],
        }
    }

    /// Checks that every value `v` (except those equal to `skip`, if given) satisfies
    /// `0 <= v < bound`, or returns [`Error::IndexOutOfRange`] at the first offender, naming
    /// `operand`, the element and its value. After this, `get(at) as usize` is a valid index
    /// below `bound` for every element that is not `skip`.
    pub(crate) fn check_below(
        &self,
        op: &'static str,
        operand: &'static str,
        bound: usize,
        skip: Option<i64>,
    ) -> Result<()> {
        let fits = |v: i64| Some(v) == skip || usize::try_from(v).is_ok_and(|v| v < bound);
        self.check(op, operand, bound, fits)
    }

    /// Checks that every value is `>= 0` (with no upper limit), or returns
    /// [`Error::IndexOutOfRange`] at the first negative one, naming `operand`, the element and
    /// its value, with `i64::MAX` as the reported bound.
    pub(crate) fn check_non_negative(&self, op: &'static str, operand: &'static str) -> Result<()> {
        self.check(op, operand, i64::MAX as usize, |v| v >= 0)
    }

    /// [`Error::IndexOutOfRange`] (reporting `bound`) at the first value that `fits` rejects.
    fn check(
        &self,
        op: &'static str,
        operand: &'static str,
        bound: usize,
        fits: impl Fn(i64) -> bool,
    ) -> Result<()> {
        fn first_misfit<I: Copy + Into<i64>>(
            values: &[I],
            fits: impl Fn(i64) -> bool,
        ) -> Option<(usize, i64)> {
            values
                .iter()
                .map(|&v| v.into())
                .enumerate()
                .find(|&(_, v)| !fits(v))
        }
        let misfit = match self {
            Indices::I32(s) => first_misfit(s, fits),
            Indices::I64(s) => first_misfit(s, fits),
        };
        match misfit {
            None => Ok(()),
            Some((at, value)) => Err(Error::IndexOutOfRange {
                op,
                operand,
                at,
                value,
                bound,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of<'a>(view: &TensorView<'a>) -> Result<Indices<'a>> {
        Indices::of("op", "ids", view)
    }

    fn out_of_range(at: usize, value: i64, bound: usize) -> Error {
        Error::IndexOutOfRange {
            op: "op",
            operand: "ids",
            at,
            value,
            bound,
        }
    }

    #[test]
    fn both_dtypes_read_as_i64() {
        let narrow = [3i32, -1, i32::MAX];
        let view = TensorView::contiguous(&narrow[..], [3]).unwrap();
        let ids = of(&view).unwrap();
        assert!(matches!(ids, Indices::I32(_)));
        assert_eq!(ids.len(), 3);
        assert_eq!(
            (0..3).map(|at| ids.get(at)).collect::<Vec<_>>(),
            [3, -1, i64::from(i32::MAX)]
        );

        let wide = [0i64, 7, 1 << 40, i64::MIN, 5];
        // A view of the middle three elements, as a [3, 1] tensor.
        let view = TensorView::new(&wide[..], [3, 1], &[1, 1], 1).unwrap();
        let ids = of(&view).unwrap();
        assert!(matches!(ids, Indices::I64(_)));
        assert_eq!(ids.len(), 3);
        assert_eq!(
            (0..3).map(|at| ids.get(at)).collect::<Vec<_>>(),
            [7, 1 << 40, i64::MIN]
        );

        let none: [i32; 0] = [];
        let view = TensorView::contiguous(&none[..], [0]).unwrap();
        let ids = of(&view).unwrap();
        assert_eq!(ids.len(), 0);
        assert_eq!(ids.check_below("op", "ids", 0, None), Ok(()));
        assert_eq!(ids.check_non_negative("op", "ids"), Ok(()));
    }

    #[test]
    fn check_below_reports_the_first_offender() {
        for (values, bound, want) in [
            (vec![0i64, 3, 4], 5, None),
            (vec![0, 5, -1], 5, Some((1, 5))),
            (vec![0, -1, 5], 5, Some((1, -1))),
            (vec![i64::MIN, 0], 1, Some((0, i64::MIN))),
            (vec![i64::MAX], usize::MAX, None),
            (vec![0], 0, Some((0, 0))),
        ] {
            // Both dtypes where the values fit i32, i64 alone otherwise.
            let narrow: Option<Vec<i32>> = values.iter().map(|&v| i32::try_from(v).ok()).collect();
            let mut views = vec![TensorView::contiguous(&values[..], [values.len()]).unwrap()];
            if let Some(narrow) = &narrow {
                views.push(TensorView::contiguous(&narrow[..], [narrow.len()]).unwrap());
            }
            for view in &views {
                let got = of(view).unwrap().check_below("op", "ids", bound, None);
                let want = want.map_or(Ok(()), |(at, value)| Err(out_of_range(at, value, bound)));
                assert_eq!(got, want, "{values:?} below {bound}");
            }
        }
    }

    #[test]
    fn check_below_skips_the_ignored_value() {
        let targets = [2i32, -100, 0, -100];
        let view = TensorView::contiguous(&targets[..], [4]).unwrap();
        let ids = of(&view).unwrap();
        assert_eq!(ids.check_below("op", "ids", 3, Some(-100)), Ok(()));
        assert_eq!(
            ids.check_below("op", "ids", 3, None),
            Err(out_of_range(1, -100, 3))
        );
        // Skipping one value does not let another through.
        assert_eq!(
            ids.check_below("op", "ids", 2, Some(-100)),
            Err(out_of_range(0, 2, 2))
        );
        // A skipped value inside the range is skipped all the same.
        let wide = [5i64, 1, 5];
        let view = TensorView::contiguous(&wide[..], [3]).unwrap();
        assert_eq!(
            of(&view).unwrap().check_below("op", "ids", 2, Some(5)),
            Ok(())
        );
        let err = Error::IndexOutOfRange {
            op: "op",
            operand: "ids",
            at: 1,
            value: -100,
            bound: 3,
        };
        assert_eq!(
            err.to_string(),
            "op: operand `ids` holds -100 at element 1, outside 0..3"
        );
    }

    #[test]
    fn check_non_negative_has_no_upper_limit() {
        let positions = [0i64, i64::MAX, -3, -4];
        let view = TensorView::contiguous(&positions[..2], [2]).unwrap();
        assert_eq!(of(&view).unwrap().check_non_negative("op", "ids"), Ok(()));
        let view = TensorView::contiguous(&positions[..], [4]).unwrap();
        assert_eq!(
            of(&view).unwrap().check_non_negative("op", "ids"),
            Err(out_of_range(2, -3, i64::MAX as usize))
        );
        let narrow = [i32::MAX, i32::MIN];
        let view = TensorView::contiguous(&narrow[..], [2]).unwrap();
        assert_eq!(
            of(&view).unwrap().check_non_negative("op", "ids"),
            Err(out_of_range(1, i64::from(i32::MIN), i64::MAX as usize))
        );
    }

    #[test]
    fn other_dtypes_are_a_dtype_error_naming_the_operand() {
        let floats = [0f32, 1.0];
        let view = TensorView::contiguous(&floats[..], [2]).unwrap();
        let err = of(&view).unwrap_err();
        assert_eq!(
            err,
            Error::DType {
                op: "op",
                operand: "ids",
                expected: DType::I64,
                got: DType::F32,
            }
        );
        assert_eq!(
            err.to_string(),
            "op: operand `ids` has dtype f32, expected i64"
        );
        let doubles = [0f64];
        let view = TensorView::contiguous(&doubles[..], [1]).unwrap();
        assert!(matches!(
            of(&view),
            Err(Error::DType {
                operand: "ids",
                got: DType::F64,
                ..
            })
        ));
    }

    #[test]
    fn non_contiguous_views_are_rejected() {
        // Every second element of four, in both dtypes.
        let wide = [0i64, 9, 1, 9];
        let view = TensorView::new(&wide[..], [2], &[2], 0).unwrap();
        assert!(matches!(
            of(&view),
            Err(Error::NotContiguous {
                op: "op",
                operand: "ids",
                ..
            })
        ));
        let narrow = [0i32, 9, 1, 9];
        let view = TensorView::new(&narrow[..], [2, 2], &[1, 2], 0).unwrap();
        assert!(matches!(
            of(&view),
            Err(Error::NotContiguous { operand: "ids", .. })
        ));
    }
}
