//! Amounts: minor units (what every row and ledger entry stores, what every
//! PSP's amount is converted to) and their ISO 4217 exponents, which say how
//! many of them make a major unit (JPY 0, EUR 2, KWD 3). The store, the
//! console and the tools write amounts for people in major units; the
//! providers convert a PSP's decimal amount to minor units exactly
//! (`providers/fields.rs`), with the same table.

/// The number of minor-unit digits of an ISO 4217 currency (JPY 0, EUR 2,
/// KWD 3), for the PSPs that send decimal amounts (PayPal). `None` for a code
/// not in this table: such an amount cannot be converted exactly, so it is
/// refused rather than guessed. The table holds every currency PayPal
/// accepts and the usual zero- and three-decimal ones; HUF and TWD are 2 as
/// ISO 4217 says (PayPal sends them without decimals, which converts the same).
pub fn minor_unit_exponent(currency: &str) -> Option<u32> {
    const ZERO: &[&str] = &[
        "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
        "VUV", "XAF", "XOF", "XPF",
    ];
    const THREE: &[&str] = &["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"];
    const TWO: &[&str] = &[
        "AED", "ARS", "AUD", "BGN", "BRL", "CAD", "CHF", "CNY", "COP", "CZK", "DKK", "EGP", "EUR",
        "GBP", "HKD", "HUF", "IDR", "ILS", "INR", "KZT", "MAD", "MXN", "MYR", "NGN", "NOK", "NZD",
        "PEN", "PHP", "PKR", "PLN", "QAR", "RON", "RSD", "RUB", "SAR", "SEK", "SGD", "THB", "TRY",
        "TWD", "UAH", "USD", "ZAR",
    ];
    if ZERO.contains(&currency) {
        Some(0)
    } else if THREE.contains(&currency) {
        Some(3)
    } else if TWO.contains(&currency) {
        Some(2)
    } else {
        None
    }
}

/// `minor` minor units of `currency` written in major units with the
/// currency's code, the inverse of the providers' decimal conversion: `10000 EUR` is
/// `100.00 EUR`, `1000 JPY` is `1000 JPY`, `1000 KWD` is `1.000 KWD`. Integer
/// arithmetic only. A code outside [`minor_unit_exponent`]'s table has no
/// known exponent: it is written as it is stored, marked as minor units,
/// rather than guessed.
pub fn major_units(minor: i64, currency: &str) -> String {
    match major_amount(minor, currency) {
        Some(amount) => format!("{amount} {currency}"),
        None => format!("{minor} {currency} (minor units)"),
    }
}

/// The number of [`major_units`] alone (`"100.00"`), `None` for a currency
/// without a known exponent.
pub fn major_amount(minor: i64, currency: &str) -> Option<String> {
    let exponent = minor_unit_exponent(currency)?;
    let sign = if minor < 0 { "-" } else { "" };
    let magnitude = minor.unsigned_abs();
    if exponent == 0 {
        return Some(format!("{sign}{magnitude}"));
    }
    let scale = 10u64.pow(exponent);
    let width = exponent as usize;
    Some(format!(
        "{sign}{}.{:0width$}",
        magnitude / scale,
        magnitude % scale
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_units_are_written_in_major_units_with_the_currency_exponent() {
        assert_eq!(major_units(10000, "EUR"), "100.00 EUR");
        assert_eq!(major_units(5, "EUR"), "0.05 EUR");
        assert_eq!(major_units(0, "USD"), "0.00 USD");
        assert_eq!(major_units(1000, "JPY"), "1000 JPY");
        assert_eq!(major_units(1000, "KWD"), "1.000 KWD");
        assert_eq!(major_units(-2050, "EUR"), "-20.50 EUR");
        assert_eq!(major_units(i64::MIN, "EUR"), "-92233720368547758.08 EUR");
        assert_eq!(major_units(1234, "XYZ"), "1234 XYZ (minor units)");
        assert_eq!(major_amount(10000, "EUR").as_deref(), Some("100.00"));
        assert_eq!(major_amount(1234, "XYZ"), None);
    }

    #[test]
    fn the_exponent_table_knows_the_usual_currencies() {
        assert_eq!(minor_unit_exponent("JPY"), Some(0));
        assert_eq!(minor_unit_exponent("USD"), Some(2));
        assert_eq!(minor_unit_exponent("KWD"), Some(3));
        assert_eq!(minor_unit_exponent("HUF"), Some(2));
        assert_eq!(minor_unit_exponent("XYZ"), None);
        assert_eq!(minor_unit_exponent("usd"), None);
    }
}
