package chat

import (
	"strconv"
	"strings"
	"time"
)

// strftime formats t as Python's datetime.strftime does for the naive
// datetime that transformers' strftime_now gets from datetime.now(), under
// glibc in the C locale: %Z and %z are empty for a naive time, and glibc's
// '-' flag ("%-d") drops the padding. A directive it does not know is
// copied through, as glibc does.
func strftime(format string, t time.Time) string {
	var sb strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			sb.WriteByte(c)
			continue
		}
		start := i
		i++
		noPad := false
		if format[i] == '-' && i+1 < len(format) {
			noPad = true
			i++
		}
		num := func(n, width int) {
			s := strconv.Itoa(n)
			if !noPad {
				for len(s) < width {
					s = "0" + s
				}
			}
			sb.WriteString(s)
		}
		switch format[i] {
		case 'a':
			sb.WriteString(t.Weekday().String()[:3])
		case 'A':
			sb.WriteString(t.Weekday().String())
		case 'b', 'h':
			sb.WriteString(t.Month().String()[:3])
		case 'B':
			sb.WriteString(t.Month().String())
		case 'd':
			num(t.Day(), 2)
		case 'e':
			if noPad {
				num(t.Day(), 1)
			} else {
				s := strconv.Itoa(t.Day())
				if len(s) < 2 {
					s = " " + s
				}
				sb.WriteString(s)
			}
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			num(h, 2)
		case 'j':
			num(t.YearDay(), 3)
		case 'm':
			num(int(t.Month()), 2)
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'f':
			num(t.Nanosecond()/1000, 6)
		case 'p':
			if t.Hour() < 12 {
				sb.WriteString("AM")
			} else {
				sb.WriteString("PM")
			}
		case 'y':
			num(t.Year()%100, 2)
		case 'Y':
			sb.WriteString(strconv.Itoa(t.Year()))
		case 'w':
			num(int(t.Weekday()), 1)
		case 'u':
			wd := int(t.Weekday())
			if wd == 0 {
				wd = 7
			}
			num(wd, 1)
		case 'U':
			num((t.YearDay()+6-int(t.Weekday()))/7, 2)
		case 'W':
			num((t.YearDay()+6-(int(t.Weekday())+6)%7)/7, 2)
		case 'D':
			sb.WriteString(strftime("%m/%d/%y", t))
		case 'F':
			sb.WriteString(strftime("%Y-%m-%d", t))
		case 'T':
			sb.WriteString(strftime("%H:%M:%S", t))
		case 'R':
			sb.WriteString(strftime("%H:%M", t))
		case 'c':
			sb.WriteString(strftime("%a %b %e %H:%M:%S %Y", t))
		case 'x':
			sb.WriteString(strftime("%m/%d/%y", t))
		case 'X':
			sb.WriteString(strftime("%H:%M:%S", t))
		case 'n':
			sb.WriteByte('\n')
		case 't':
			sb.WriteByte('\t')
		case 'Z', 'z':
		case '%':
			sb.WriteByte('%')
		default:
			sb.WriteString(format[start : i+1])
		}
	}
	return sb.String()
}
